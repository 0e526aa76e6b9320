"""The Python module with CUDA device memory: what a connector does with torch CUDA tensors
(``t.data_ptr()``, ``t.nbytes``), through the library's GPU path (client/mem/gpu.c, staged
on tcp and shm), against a real kvpool-master and `kvpool serve` segment.

Device memory comes from the CUDA driver API through ctypes (no torch needed): the library
named by $KVPOOL_CUDA_LIB, else libcuda.so.1, which is also what libkvpool loads.

Run two ways (tests/gpu/run_gpu_python.sh):
  - in CI, with KVPOOL_CUDA_LIB naming libfake_cuda.so, the test double of the driver
    (tests/gpu/fake_cuda.c): its device memory is a PROT_NONE mapping, so any CPU access
    to it by the library crashes this process. That checks the module hands device
    pointers to the GPU path and never touches them; it proves nothing about a real GPU;
  - in the `gpu` meson suite, with the real driver on a GPU machine (exit 77, SKIP,
    without one).

Every test checks the bytes that come back by copying the device buffer to the host.
"""

import ctypes
import importlib.util
import os

import numpy as np
import pytest

import kvpool
from mooncake.store import MooncakeDistributedStore

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "kvp_pool_fixtures", os.path.join(_here, "..", "python", "conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

CUdeviceptr = ctypes.c_ulonglong


class Cuda:
    """Just enough of the driver API to own device memory and move bytes in and out."""

    def __init__(self):
        self.lib = ctypes.CDLL(os.environ.get("KVPOOL_CUDA_LIB") or "libcuda.so.1")
        L = self.lib
        L.cuInit.argtypes = [ctypes.c_uint]
        L.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        L.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        L.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        L.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(CUdeviceptr), ctypes.c_size_t]
        L.cuMemFree_v2.argtypes = [CUdeviceptr]
        L.cuMemcpyHtoD_v2.argtypes = [CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t]
        L.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, CUdeviceptr, ctypes.c_size_t]
        self.check(L.cuInit(0), "cuInit")
        n = ctypes.c_int(0)
        self.check(L.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        if n.value < 1:
            raise RuntimeError("no CUDA device")
        dev = ctypes.c_int(0)
        self.check(L.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(L.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.current()
        self.allocs = []
        # the test double counts the library's async staging copies (ours are synchronous)
        self.fake = hasattr(L, "fake_cuda_counter")
        if self.fake:
            L.fake_cuda_counter.argtypes = [ctypes.c_char_p]
            L.fake_cuda_counter.restype = ctypes.c_long

    def staged(self):
        """(device->host, host->device) async copies the library has finished so far; None on
        a real driver, which does not count them."""
        if not self.fake:
            return None
        return (self.lib.fake_cuda_counter(b"dtoh_done"), self.lib.fake_cuda_counter(b"htod_done"))

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUDA error {rc}")

    def current(self):
        """Make the context current on this thread (as torch does for its threads)."""
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def alloc(self, n):
        p = CUdeviceptr(0)
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc_v2")
        self.allocs.append(p.value)
        return p.value

    def upload(self, host):
        """A new device buffer holding the bytes of the numpy array `host`."""
        d = self.alloc(host.nbytes)
        self.check(self.lib.cuMemcpyHtoD_v2(d, host.ctypes.data, host.nbytes), "cuMemcpyHtoD_v2")
        return d

    def zeros(self, n):
        return self.upload(np.zeros(n, np.uint8))

    def download(self, d, n):
        out = np.empty(n, np.uint8)
        self.check(self.lib.cuMemcpyDtoH_v2(out.ctypes.data, d, n), "cuMemcpyDtoH_v2")
        return out

    def free_all(self):
        for p in self.allocs:
            self.lib.cuMemFree_v2(p)
        self.allocs = []


@pytest.fixture(scope="module")
def cuda():
    c = Cuda()
    yield c
    c.free_all()


@pytest.fixture(scope="module")
def pool(request):
    return _fixtures._pool(request, segments=("64MiB",))


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


SIZES = (1, 4096, 65536 + 13, (1 << 20) + 4097)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_batch_put_get_device_buffers(pool, cuda, transport):
    """Device -> pool -> device, device -> pool -> host, host -> pool -> device."""
    cuda.current()
    srcs = [pattern(n, i) for i, n in enumerate(SIZES)]
    dev_src = [cuda.upload(a) for a in srcs]
    keys = [f"gpu-{transport}-{i}" for i in range(len(SIZES))]
    with kvpool.Client(pool.addr, transport=transport) as c:
        before = cuda.staged()
        assert c.batch_put(keys, [(d, a.nbytes) for d, a in zip(dev_src, srcs)]) == [0] * len(keys)
        dev_dst = [cuda.zeros(a.nbytes + 64) for a in srcs]
        got = c.batch_get_into(keys, [(d, a.nbytes + 64) for d, a in zip(dev_dst, srcs)])
        assert got == [a.nbytes for a in srcs]
        if before is not None:  # the bytes went through the GPU path, both ways
            after = cuda.staged()
            assert after[0] - before[0] >= len(keys) and after[1] - before[1] >= len(keys)
        for d, a in zip(dev_dst, srcs):
            back = cuda.download(d, a.nbytes + 64)
            assert np.array_equal(back[: a.nbytes], a)
            assert not back[a.nbytes:].any()  # nothing written past the object
        # what the device put is what a host reader gets, and the other way round
        host = [np.zeros(a.nbytes, np.uint8) for a in srcs]
        assert c.batch_get_into(keys, host) == [a.nbytes for a in srcs]
        assert all(np.array_equal(h, a) for h, a in zip(host, srcs))
        hkeys = [k + "-h" for k in keys]
        assert c.batch_put(hkeys, srcs) == [0] * len(keys)
        dev2 = [cuda.zeros(a.nbytes) for a in srcs]
        assert c.batch_get_into(hkeys, [(d, a.nbytes) for d, a in zip(dev2, srcs)]) == [
            a.nbytes for a in srcs]
        assert all(np.array_equal(cuda.download(d, a.nbytes), a) for d, a in zip(dev2, srcs))
        # per key: a miss and a device buffer too small
        assert c.batch_get_into([keys[3], "gpu-none"], [(dev2[0], 1), (dev2[1], 4096)]) == [
            kvpool.ERR_BUFFER_TOO_SMALL, kvpool.ERR_NOT_FOUND]
        assert c.batch_remove(keys + hkeys) == [0] * (2 * len(keys))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_multi_buffers_device_and_host_pieces(pool, cuda, transport):
    """A layer-wise object from device pieces, read back into device and host pieces."""
    cuda.current()
    layers = [pattern(16384, 100 + i) for i in range(8)]
    dev = [cuda.upload(a) for a in layers]
    key = f"gpu-multi-{transport}"
    whole = np.concatenate(layers)
    with kvpool.Client(pool.addr, transport=transport) as c:
        assert c.batch_put_multi([key], [[(d, a.nbytes) for d, a in zip(dev, layers)]]) == [0]
        assert c.get(key) == whole.tobytes()
        out_dev = [cuda.zeros(16384) for _ in range(4)]
        out_host = [np.zeros(16384, np.uint8) for _ in range(4)]
        pieces = []
        for i in range(8):  # device and host pieces, alternating
            pieces.append((out_dev[i // 2], 16384) if i % 2 == 0 else out_host[i // 2])
        assert c.batch_get_into_multi([key], [pieces]) == [whole.nbytes]
        for i in range(8):
            got = cuda.download(out_dev[i // 2], 16384) if i % 2 == 0 else out_host[i // 2]
            assert np.array_equal(got, layers[i])
        assert c.batch_remove([key]) == [0]


def test_mooncake_store_device_pointers(pool, cuda):
    """The drop-in as vLLM's connector calls it: register, batch_put_from, batch_get_into."""
    cuda.current()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == 0
    try:
        srcs = [pattern(n, 7 + i) for i, n in enumerate((4096, 1 << 20))]
        dev = [cuda.upload(a) for a in srcs]
        out = [cuda.zeros(a.nbytes) for a in srcs]
        for d, a in zip(dev + out, srcs + srcs):
            assert s.register_buffer(d, a.nbytes) == 0
        keys = ["gpu-mc-0", "gpu-mc-1"]
        assert s.batch_put_from(keys, dev, [a.nbytes for a in srcs]) == [0, 0]
        assert s.batch_is_exist(keys) == [1, 1]
        assert s.batch_get_into(keys, out, [a.nbytes for a in srcs]) == [a.nbytes for a in srcs]
        assert all(np.array_equal(cuda.download(d, a.nbytes), a) for d, a in zip(out, srcs))
        assert s.batch_get_into(["gpu-mc-none"], [out[0]], [4096]) == [-704]
        for d in dev + out:
            assert s.unregister_buffer(d) == 0
        assert s.remove("gpu-mc-0") == 0
    finally:
        s.close()
