#!/usr/bin/env bash
# Build kvpool and run the default test suites (unit, integration) twice:
# a normal build in build/ and an AddressSanitizer + UBSan build in
# build-asan/. Ends with one plain line "N passed, N failed" (counts of
# test programs over both builds); exits non-zero if anything failed.
#
#   deploy/test.sh            unit, integration, fault (+ ASan/UBSan), bench, fuzzing
#   deploy/test.sh --rdma     the same, then the rdma suite on real verbs in a
#                             Soft-RoCE VM (deploy/test-rdma.sh; what CI runs)
#   deploy/test.sh --no-asan  normal build only (no sanitizers, no fuzzing)
#
# Suites: unit, integration, fault (tests/fault); bench (a ~20 s smoke of every
# kvpool-bench mode) and the Python module's pytest suite (tests/python, its
# tests counted one each) once, on the normal build only; then deploy/fuzz.sh;
# with --rdma, suite rdma (tests/rdma) through the VM, its tests counted one each.
# After the normal build's pytest run, tests/net (run_net: hosts in network namespaces,
# links cut and healed, tests/net/checker.py's verdict; as root), then the TLS pass (run_tls_pass): the integration tests
# that use the library's clients, the fault suite and the pytest suite again, every master
# with TLS 1.3 and an ACL.
# Then tests/pip/test_pip.sh (pip install . and the API's pytest files from a venv, a wheel
# installed in another), its checks counted one each.
# After the normal build's pytest run: tests/deploy/test_deploy.sh (systemd units,
# Kubernetes manifests, Grafana dashboard, the Debian package built in a copy of
# the tree, installed, its daemons started), its checks counted one each.
set -uo pipefail
cd "$(dirname "$0")/.."

asan=1
rdma=0
for arg in "$@"; do
  case $arg in
    --no-asan) asan=0 ;;
    --rdma) rdma=1 ;;
    *) echo "usage: deploy/test.sh [--rdma] [--no-asan]" >&2; exit 2 ;;
  esac
done

deploy/install-deps.sh || { echo "0 passed, 1 failed"; exit 1; }
# The installer ran: tests that need torch (tests/python/test_tensor.py) fail without it
# instead of skipping.
export KVPOOL_TEST_REQUIRE_TORCH=1

passed=0
failed=0
rc_all=0

# Each phase's wall time, printed as it ends and summed up before the totals (CI has 30
# minutes to aim for: this says where they go).
phase_t0=$SECONDS
phase_log=""
phase() { # name of the phase that just ended
  local s=$((SECONDS - phase_t0))
  phase_t0=$SECONDS
  phase_log+="$(printf '  %-28s %5d s' "$1" "$s")"$'\n'
  echo "== phase $1: $s s"
}

# Add one `meson test` run's counts (its output file, its exit status) to the totals.
tally() {
  local out=$1 rc=$2
  [ "$rc" -ne 0 ] && rc_all=1
  v() { awk -v k="$1" -F: '$1==k {gsub(/ /,"",$2); print $2}' "$out" | tail -1; }
  local ok fail xf up to
  ok=$(v Ok); fail=$(v Fail); xf=$(v 'Expected Fail'); up=$(v 'Unexpected Pass'); to=$(v Timeout)
  passed=$((passed + ${ok:-0} + ${xf:-0}))
  failed=$((failed + ${fail:-0} + ${up:-0} + ${to:-0}))
  if [ "$rc" -ne 0 ] && [ "${fail:-0}" = 0 ] && [ "${to:-0}" = 0 ]; then failed=$((failed+1)); fi
}

run_suite() { # builddir, setup args...; returns non-zero when the build failed
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; failed=$((failed+1)); rc_all=1; return 1; }
  fi
  if ! ninja -C "$dir" >"$dir.ninja.log" 2>&1; then
    cat "$dir.ninja.log"; failed=$((failed+1)); rc_all=1; return 1
  fi
  meson test -C "$dir" --suite unit --suite integration --suite fault --print-errorlogs \
    --num-processes 2 2>&1 | tee "$dir/meson-test.out"
  tally "$dir/meson-test.out" "${PIPESTATUS[0]}"
  return 0
}

# The Python module (client/python: kvpool, mooncake.store) under pytest (tests/python),
# against a build dir's tree (PYTHONPATH, the daemons the fixtures start); each test
# counts. The interpreter: the first python3 that imports pytest, numpy and the built
# module (a pyenv python3 without pytest falls back to Debian's /usr/bin/python3).
# The suite's tests wait far more than they compute (daemons starting, leases and
# deadlines running out): pytest-xdist (python3-pytest-xdist) runs them in two workers
# (each draws its ports from its own slice: tests/python/conftest.py's free_port). Not the
# fuzzers (PYTEST_ALONE): they load both cores for a fixed time, so they run after, one at
# a time, as before, beside no test that times itself; nor test_ops_http.py, whose hostile
# clients test compares the master's answers per second before and during a flood (a
# neighbour's load changing in between failed it once in three proof runs).
# KVPOOL_PYTEST_JOBS=1: one process.
PYTEST_ALONE=(test_insider_fuzz.py test_owner_fuzz.py test_http_insider_fuzz.py test_ops_http.py)
run_pytest() { # builddir [output name]
  local dir=$1 out=${2:-pytest} py n=${KVPOOL_PYTEST_JOBS:-2} f
  if ! py=$(deploy/pick-python.sh "$dir"); then
    echo "pytest: cannot run"
    failed=$((failed+1)); rc_all=1; return
  fi
  pyt() { # output file, pytest arguments...
    local o=$1; shift
    PYTHONPATH=$dir/client/python KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
      KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
      "$py" -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$o"
    tally_pytest "$o" "${PIPESTATUS[0]}"
  }
  if [ "$n" -gt 1 ] 2>/dev/null && "$py" -c 'import xdist' 2>/dev/null; then
    local ignore=()
    for f in "${PYTEST_ALONE[@]}"; do ignore+=(--ignore "tests/python/$f"); done
    pyt "$dir/$out.out" -n "$n" "${ignore[@]}" tests/python
    pyt "$dir/$out-alone.out" "${PYTEST_ALONE[@]/#/tests/python/}"
  else
    pyt "$dir/$out.out" tests/python
  fi
}

# Mooncake Store's own Python tests, unchanged (../shared/peers/mooncake-tests), against
# kvpool's mooncake package (tests/mooncake/run_upstream.py): each file against a
# master of its own, four files at a time. Its last line "N passed, N failed" is counted;
# a skip not for hardware (CUDA, RDMA) counts as failed.
run_mooncake() { # builddir
  local dir=$1 py res
  if ! py=$(deploy/pick-python.sh "$dir"); then
    echo "mooncake-upstream: cannot run"
    failed=$((failed+1)); rc_all=1; return
  fi
  PYTHONPATH=$dir/client/python PYTHON=$py KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
    KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
    "$py" tests/mooncake/run_upstream.py --jobs 4 2>&1 |
    tee "$dir/mooncake-upstream.out"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc_all=1
  res=$(tail -n 1 "$dir/mooncake-upstream.out")
  if [[ $res =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    failed=$((failed + 1)); rc_all=1
  fi
}

# The network test bed (tests/net): hosts in network namespaces, links cut and
# healed under a logging workload, a checker of every promise; its short scenarios here
# (root only: a non-root run counts it as failed, not skipped).
run_net() { # builddir
  local dir=$1 py
  if [ "$(id -u)" != 0 ] || ! py=$(deploy/pick-python.sh "$dir"); then
    echo "net: cannot run (needs root and a python3 with pytest)"
    failed=$((failed+1)); rc_all=1; return
  fi
  PYTHONPATH=$dir/client/python KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
    KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
    KVPOOL_NET_REPORT=$dir/net-report.jsonl \
    "$py" -m pytest -q -p no:cacheprovider tests/net 2>&1 | tee "$dir/net.out"
  tally_pytest "$dir/net.out" "${PIPESTATUS[0]}"
}

# The TLS pass: the Python suite, the integration tests that use only the library's
# clients, and the fault suite, a second time with TLS 1.3 and an ACL on every master they
# start (tests/python/conftest.py and tests/harness.c read KVPOOL_TEST_TLS_DIR):
# certificates from deploy/make-certs.sh, one admin principal named by its client
# certificate, which every client, serve and CLI of the tests presents through
# $KVPOOL_TLS_* (test_security.py makes its own certificates and ACLs in both passes). The
# fault suite's raw frames go over TLS with that certificate, and its hostile connections
# add plain bytes to the TLS port, sessions with no principal and data requests without a
# valid grant (tests/fault/test_fault.c). Not in it: test_ops_http.py (the plain-HTTP
# views), and the integration tests that speak raw frames or plain HTTP to the master, or
# check plain-connection error texts (test_badinput, test_cache, test_errors, test_ha,
# test_http, cli, protected). With TLS on, the master hands out data grants, so every tcp
# transfer of these tests (and test_stress's 30 s of mixed load) carries grants and proves
# its principal to the owners.
TLS_INTEGRATION=(test_store test_concurrency test_lifecycle test_ssd test_restart test_multi
  test_stress)
run_tls_pass() { # builddir
  local dir=$1 tls
  tls=$(mktemp -d)
  if ! deploy/make-certs.sh "$tls" admin >"$dir/make-certs.log" 2>&1; then
    cat "$dir/make-certs.log"; echo "TLS pass: cannot make certificates"
    failed=$((failed+1)); rc_all=1; rm -rf "$tls"; return
  fi
  printf '[principal admin]\nroles = read, write, segment, admin\ncert-cn = admin\n' >"$tls/acl.conf"
  export KVPOOL_TEST_TLS_DIR=$tls KVPOOL_TLS_CA=$tls/ca.crt KVPOOL_TLS_CERT=$tls/admin.crt \
    KVPOOL_TLS_KEY=$tls/admin.key
  meson test -C "$dir" --suite integration --suite fault --print-errorlogs --num-processes 2 \
    "${TLS_INTEGRATION[@]}" test_fault 2>&1 | tee "$dir/meson-test-tls.out"
  tally "$dir/meson-test-tls.out" "${PIPESTATUS[0]}"
  run_pytest "$dir" pytest-tls
  unset KVPOOL_TEST_TLS_DIR KVPOOL_TLS_CA KVPOOL_TLS_CERT KVPOOL_TLS_KEY
  rm -rf "$tls"
}

# Count a pytest run from its output's last line ("2 failed, 46 passed, 1 error in 31.2s")
# and its exit status (non-zero with no failure counted: one failure).
tally_pytest() { # outfile rc
  local out=$1 rc=$2 line ok fail err
  [ "$rc" -ne 0 ] && rc_all=1
  line=$(tail -n 1 "$out")
  ok=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
  fail=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  err=$(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+')
  passed=$((passed + ${ok:-0}))
  failed=$((failed + ${fail:-0} + ${err:-0}))
  if [ "$rc" -ne 0 ] && [ "${fail:-0}" = 0 ] && [ "${err:-0}" = 0 ]; then failed=$((failed+1)); fi
}

# Formatting (.clang-format) is part of the tests: one more check, counted like a test.
if command -v clang-format >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; then
  if git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror 2>"format.log"; then
    echo "format: OK"; passed=$((passed+1))
  else
    head -40 format.log; echo "format: FAIL (run: clang-format -i \$(git ls-files '*.c' '*.h'))"
    failed=$((failed+1)); rc_all=1
  fi
  rm -f format.log
fi

# The bench suite (a short smoke of every kvpool-bench mode, and of data mode's threads
# sharing one client: bench_smoke_threads_*) once, on the normal build;
# not under ASan: it measures, and its figures would be the sanitizer's.
phase deps+format
if run_suite build; then
  phase build+unit/integration/fault
  meson test -C build --suite bench --print-errorlogs 2>&1 | tee build/meson-test-bench.out
  tally build/meson-test-bench.out "${PIPESTATUS[0]}"
  phase bench-smoke
  run_pytest build
  phase pytest
  run_mooncake build
  phase mooncake-upstream
  run_net build
  phase net
  run_tls_pass build
  phase tls-pass
  # The module with CUDA device memory (tests/gpu/test_gpu_python.py; the transfer engine's
  # _on_cuda forms: test_gpu_te.py) against the test
  # double of the driver (tests/gpu/fake_cuda.c): device pointers from Python take the
  # library's GPU path, and nothing touches device memory on the CPU. It proves nothing
  # about a real GPU: the gpu suite runs the same file on one.
  KVPOOL_CUDA_LIB=$PWD/build/tests/libfake_cuda.so tests/gpu/run_gpu_python.sh build 2>&1 |
    tee build/pytest-gpu-fake.out
  tally_pytest build/pytest-gpu-fake.out "${PIPESTATUS[0]}"
fi
phase gpu-fake

# deploy/ and debian/: units (systemd-analyze verify), manifests (kubectl apply
# --dry-run=client), dashboard, and the Debian package: built (~1 min), installed,
# its daemons started, removed again. Its last line "N passed, N failed" is counted.
deploy_tests() {
  tests/deploy/test_deploy.sh 2>&1 | tee deploy-test.out
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc_all=1
  local res
  res=$(tail -n 1 deploy-test.out)
  if [[ $res =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    failed=$((failed + 1)); rc_all=1
  fi
  rm -f deploy-test.out
}
deploy_tests
phase deploy

# The Python packaging (tests/pip): pip install . into a fresh venv from a copy of the tree
# and the pytest files of the modules' API from that venv against the installed modules
# (the whole suite ran against the build tree above); a wheel built with
# python3 -m build, installed in a second venv, imported, a put/get. Its last line
# "N passed, N failed" is counted (the pytest suite's tests one each).
pip_tests() {
  tests/pip/test_pip.sh 2>&1 | tee pip-test.out
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc_all=1
  local res
  res=$(tail -n 1 pip-test.out)
  if [[ $res =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    failed=$((failed + 1)); rc_all=1
  fi
  rm -f pip-test.out
}
pip_tests
phase pip

# A release build (-O3, NDEBUG) compiles too: the optimiser's warnings (format truncation,
# maybe-uninitialized) differ from the debug build's, and -Werror makes them errors; the
# side-by-side benchmark (../shared/peers) and packagers build this way. Counted as one test.
release_build() {
  if { [ -f build-release/build.ninja ] ||
       meson setup build-release -Dbuildtype=release >build-release.setup.log 2>&1; } &&
     ninja -C build-release >build-release.ninja.log 2>&1; then
    echo "release-build: OK"; passed=$((passed+1))
  else
    tail -40 build-release.setup.log build-release.ninja.log 2>/dev/null
    echo "release-build: FAIL"; failed=$((failed+1)); rc_all=1
  fi
}
release_build
phase release-build
if [ "$asan" = 1 ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run_suite build-asan -Db_sanitize=address,undefined -Dc_args=-fno-sanitize-recover=all \
    -Db_lundef=false
  phase asan
fi

# Fuzzing: the master's frame + message decoder under libFuzzer (clang, ASan,
# UBSan, LSan) for a bounded time (KVPOOL_FUZZ_SECONDS, default 60; 0 skips),
# counted as one test.
fuzz_s=${KVPOOL_FUZZ_SECONDS:-60}
if [ "$asan" = 1 ] && [ "$fuzz_s" != 0 ]; then
  if deploy/fuzz.sh "$fuzz_s" 2>&1 | tee fuzz.out | tail -1 | grep -q '0 crashes$'; then
    tail -1 fuzz.out; passed=$((passed+1))
  else
    tail -60 fuzz.out; echo "fuzz: FAIL"; failed=$((failed+1)); rc_all=1
  fi
  rm -f fuzz.out
  phase fuzz
fi

# RDMA: the rdma suite inside a Soft-RoCE VM, on the normal build (build/).
# The VM image is built once into build-rdma-vm/ (Debian packages; ~1-2 min).
if [ "$rdma" = 1 ]; then
  KVPOOL_RDMA_BUILD=build deploy/test-rdma.sh 2>&1 | tee rdma.out
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc_all=1
  res=$(tail -n 1 rdma.out)
  if [[ $res =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    failed=$((failed + 1)); rc_all=1
  fi
  rm -f rdma.out
  phase rdma-vm
fi

printf 'phases (wall time):\n%s  %-28s %5d s\n' "$phase_log" total "$SECONDS"
echo "$passed passed, $failed failed"
exit $rc_all
