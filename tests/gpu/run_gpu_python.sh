#!/usr/bin/env bash
# tests/gpu/test_gpu_python.py and test_gpu_te.py under pytest, against build dir BUILD
# (default: build).
#   tests/gpu/run_gpu_python.sh [BUILD]
# With KVPOOL_CUDA_LIB naming a driver (the test double libfake_cuda.so in CI) it runs
# against that; without, against the real libcuda.so.1. No driver or no device: exit 77
# (meson: SKIP), so a run without a GPU never passes as one with it.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build}
py=$(deploy/pick-python.sh "$dir") || exit 1
if ! "$py" - <<'PY'
import ctypes, os, sys
try:
    lib = ctypes.CDLL(os.environ.get("KVPOOL_CUDA_LIB") or "libcuda.so.1")
except OSError as e:
    sys.exit(f"run_gpu_python: no CUDA driver ({e}): SKIP")
n = ctypes.c_int(0)
if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
    sys.exit("run_gpu_python: the CUDA driver finds no device: SKIP")
PY
then
  exit 77
fi
PYTHONPATH=$dir/client/python KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
  KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
  exec "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_python.py tests/gpu/test_gpu_te.py
