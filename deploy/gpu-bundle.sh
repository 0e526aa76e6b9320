#!/usr/bin/env bash
# Stage the gpu suite (tests/gpu) as a bundle that runs on a GPU machine which has the
# NVIDIA driver, a python3 with pytest and numpy, and none of kvpool's build
# dependencies: the binaries from BUILD, the shared libraries they load (glibc aside),
# and the Python module, with its extension compiled for that machine's Python.
#
#   deploy/gpu-bundle.sh [BUILD] [OUTDIR]        (defaults: build, .gpu)
#   KVPOOL_BUNDLE_PYTHON=/path/to/python3.12 deploy/gpu-bundle.sh
#
# KVPOOL_BUNDLE_PYTHON names an interpreter of the GPU machine's Python version (its
# headers compile the extension); without it the extension of BUILD is taken as is.
# The GPU machine needs a glibc at least as new as this one. OUTDIR's build/ is ignored by
# .gitignore (build/ at any depth), so a tool that sends the checkout's tracked and
# unignored files must be told to take OUTDIR along. There, from the checkout:
#
#   OUTDIR/run.sh           # gpu_real and gpu_python; exits non-zero on a failure
#   KVPOOL_GPU_BENCH=FILE OUTDIR/run.sh    # and then tests/gpu/bench_gpu.py, JSON to FILE
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-.gpu}
ninja -C "$build" >/dev/null
rm -rf "$out"
mkdir -p "$out/build/client/python" "$out/build/master" "$out/build/tests" "$out/lib"
cp -rL "$build/client/python/kvpool" "$build/client/python/mooncake" "$out/build/client/python/"
rm -rf "$out"/build/client/python/kvpool/*.so.p
cp -L "$build/client/libkvpool.so.0" "$out/lib/"
cp "$build/client/kvpool" "$out/build/client/"
cp "$build/master/kvpool-master" "$out/build/master/"
cp "$build/tests/gpu_test_gpu_real" "$out/build/tests/"

if [ -n "${KVPOOL_BUNDLE_PYTHON:-}" ]; then
  py=$KVPOOL_BUNDLE_PYTHON
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  rm -f "$out"/build/client/python/kvpool/_kvpool*.so
  # As client/python/meson.build builds it: the installed headers only, symbols hidden.
  cc -O2 -g -fPIC -shared -fvisibility=hidden -pthread -I"$inc" -Iclient/include \
    client/python/src/*.c -L"$out/lib" -l:libkvpool.so.0 \
    -o "$out/build/client/python/kvpool/_kvpool$suffix"
fi

# Every shared library the binaries load, except glibc's own (the GPU machine's is used).
for b in "$out"/build/client/kvpool "$out"/build/master/kvpool-master \
  "$out"/build/tests/gpu_test_gpu_real "$out"/lib/libkvpool.so.0 \
  "$out"/build/client/python/kvpool/_kvpool*.so; do
  LD_LIBRARY_PATH=$out/lib ldd "$b"
done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so\.|/ld-linux' |
  while read -r lib; do
    [ -e "$out/lib/$(basename "$lib")" ] || cp -L "$lib" "$out/lib/"
  done

cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# The gpu suite from this bundle (deploy/gpu-bundle.sh), run from the checkout's root.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
export LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rc=0
echo "== gpu_real"
timeout 300 "$here/build/tests/gpu_test_gpu_real" || rc=1
echo "== gpu_python"
timeout 300 bash tests/gpu/run_gpu_python.sh "${here#$PWD/}/build" || rc=1
echo "gpu suite: rc=$rc"
if [ -n "${KVPOOL_GPU_BENCH:-}" ]; then # the GPU path's speed (tests/gpu/bench_gpu.py)
  b=${here#$PWD/}/build
  echo "== bench_gpu"
  PYTHONPATH=$b/client/python KVPOOL_MASTER_BIN=$b/master/kvpool-master \
    KVPOOL_CLI_BIN=$b/client/kvpool timeout 300 "$(deploy/pick-python.sh "$b")" \
    tests/gpu/bench_gpu.py --json "$KVPOOL_GPU_BENCH" || rc=1
fi
exit $rc
EOF
chmod +x "$out/run.sh"
du -sh "$out"
