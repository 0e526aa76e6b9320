#!/usr/bin/env bash
# tests/pip/test_pip.sh: the Python packaging checks (issue 28). One line per check
# ("NAME: OK" / "NAME: FAIL ..."), then "N passed, N failed"; exits non-zero if any failed.
#
#   tests/pip/test_pip.sh
#
# Everything happens in a copy of the tree (tracked and untracked-but-not-ignored files:
# what a clean clone holds) under a temporary directory, with no package index
# (--no-index; the build backend comes from Debian: python3-mesonpy, python3-build,
# patchelf) and never with PYTHONPATH:
#   versions       meson.build's project version = debian/changelog's
#   pip-install    a venv (--system-site-packages, for Debian's pytest, numpy, torch);
#                  `pip install --no-build-isolation .` from the copy; kvpool, mooncake.store
#                  and the tools import / run from the venv, kvpool.__version__ and the
#                  wheel's metadata say the project's version
#   pip-pytest     the pytest files of the modules' API (PIP_PYTEST below: kvpool,
#                  mooncake.store, the connectors, tensors, asyncio, threads, types, TLS
#                  clients) with the venv's python3, against the installed modules
#                  (conftest.py checks where they come from: KVPOOL_TEST_MODULE_PREFIX) and
#                  the venv's kvpool-master and kvpool; failures print pytest's report. The
#                  rest of tests/python (attacks, admission, grants, events) tests the
#                  daemons' C code, the same as the build tree's that deploy/test.sh ran
#                  the whole suite against, twice (plain and TLS)
#   wheel-build    `python3 -m build --wheel --no-isolation` of the copy
#   wheel-install  the wheel into a second venv without the system's site-packages; it
#                  imports there, libkvpool is the wheel's own (.kvpool.mesonpy.libs, found
#                  by the extension's $ORIGIN rpath), and a put/get through kvpool.Client
#                  and mooncake.store against the wheel's own kvpool-master returns the bytes
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

PY=/usr/bin/python3
tmp=$(mktemp -d /tmp/kvpool-pip-test.XXXXXX)
# others may traverse it (source copies and venvs, nothing secret): the transfer-engine
# tests run a peer as user nobody from here
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
# meson-python runs ninja with its default parallelism (cores + 2); keep to 2 jobs
JOBS=${KVPOOL_PIP_JOBS:-2}

. tests/checks.sh
check_tail=60

src=$tmp/src
mkdir -p "$src"
copy_tree "$src"
unset PYTHONPATH

meson_version() { sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$src/meson.build" | head -1; }

t_versions() {
  local m d
  m=$(meson_version) d=$(sed -n '1s/^kvpool (\([^)-]*\).*/\1/p' "$src/debian/changelog")
  echo "meson.build: $m, debian/changelog: $d"
  [ -n "$m" ] && [ "$m" = "$d" ]
}

v1=$tmp/venv-pip
t_pip_install() {
  $PY -m venv --system-site-packages "$v1" || return 1
  (cd "$src" && "$v1/bin/pip" install --no-index --no-build-isolation \
    --config-settings=compile-args=-j"$JOBS" .) || return 1
  (cd "$tmp" && "$v1/bin/python3" - "$v1" "$(meson_version)" <<'EOF'
import importlib.metadata, os, sys
import kvpool, mooncake.store, mooncake.engine
for m in (kvpool, mooncake.store, mooncake.engine):
    assert m.__file__.startswith(sys.argv[1] + "/lib/"), m.__file__
    print(m.__name__, m.__file__)
assert kvpool.__version__ == sys.argv[2] == importlib.metadata.version("kvpool"), kvpool.__version__
print("version", kvpool.__version__)
EOF
  ) || return 1
  "$v1/bin/kvpool-master" --help >/dev/null 2>&1 || { echo "no kvpool-master in the venv"; return 1; }
  "$v1/bin/kvpool" --help >/dev/null 2>&1 || { echo "no kvpool CLI in the venv"; return 1; }
}

PIP_PYTEST=(test_native.py test_mooncake.py test_connectors.py test_tensor.py test_async.py
  test_kwargs.py test_threads.py test_typing.py test_client_metrics.py test_mount_segment.py
  test_security.py test_transfer_engine.py)
t_pip_pytest() {
  [ -x "$v1/bin/python3" ] || { echo "no venv (pip-install failed)"; return 1; }
  local site jobs=()
  site=$("$v1/bin/python3" -c 'import kvpool, os; print(os.path.dirname(os.path.dirname(kvpool.__file__)))')
  # two workers, as deploy/test.sh runs the suite (pytest-xdist, from the system site)
  "$v1/bin/python3" -c 'import xdist' 2>/dev/null && jobs=(-n 2)
  (cd "$tmp" && KVPOOL_TEST_MODULE_PREFIX=$site KVPOOL_MASTER_BIN=$v1/bin/kvpool-master \
    KVPOOL_CLI_BIN=$v1/bin/kvpool PYTHONDONTWRITEBYTECODE=1 \
    "$v1/bin/python3" -m pytest -q -p no:cacheprovider "${jobs[@]}" \
    "${PIP_PYTEST[@]/#/$src/tests/python/}") \
    >"$tmp/pytest.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { tail -80 "$tmp/pytest.out"; return 1; }
}

t_wheel_build() {
  (cd "$src" && $PY -m build --wheel --no-isolation --outdir "$tmp/dist" \
    -C compile-args=-j"$JOBS" .) || return 1
  ls -l "$tmp"/dist/*.whl
  note="($(basename "$(ls "$tmp"/dist/*.whl | head -1)"))"
}

t_wheel_install() {
  local whl v2=$tmp/venv-wheel
  whl=$(ls "$tmp"/dist/kvpool-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { echo "no wheel (wheel-build failed)"; return 1; }
  $PY -m venv "$v2" || return 1
  "$v2/bin/pip" install --no-index "$whl" || return 1
  (cd "$tmp" && "$v2/bin/python3" - "$v2" <<'EOF'
import os, subprocess, sys, tempfile
venv = sys.argv[1]
import kvpool, mooncake.store
assert kvpool.__file__.startswith(venv + "/lib/"), kvpool.__file__
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libkvpool" in l]
print("libkvpool:", sorted(set(libs)))
assert libs and all(l.startswith(venv + "/lib/") and ".kvpool.mesonpy.libs" in l for l in libs), libs
# the wheel's own master, one segment from this client
r, w = os.pipe()
m = subprocess.Popen([venv + "/bin/kvpool-master", "--listen", "127.0.0.1:0", "--ready-fd",
                      str(w), "--log-level", "error"], pass_fds=(w,))
os.close(w)
try:
    addr = os.read(r, 256).decode().split()[0]
    with kvpool.Client(master=addr, segment_size="32MiB") as c:
        data = os.urandom(1 << 20)
        c.put("wheel/a", data)
        assert c.get("wheel/a") == data
        s = mooncake.store.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", addr) == 0
        assert s.put("wheel/b", b"mooncake") == 0 and s.get("wheel/b") == b"mooncake"
        assert s.get("wheel/a") == data
        s.close()
    print("put/get of 1 MiB through the wheel's module and master: bytes match")
    # mooncake.engine: one engine writes into another's registered buffer
    from mooncake.engine import TransferEngine
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dst, src = a.allocate_managed_buffer(1 << 20), b.allocate_managed_buffer(1 << 20)
    assert b.write_bytes_to_buffer(src, data, len(data)) == 0
    assert b.transfer_sync_write("127.0.0.1:%d" % a.get_rpc_port(), src, dst, len(data)) == 0
    assert a.read_bytes_from_buffer(dst, len(data)) == data
    a.close(); b.close()
    print("mooncake.engine: 1 MiB written from one engine into another: bytes match")
finally:
    m.terminate()
    assert m.wait(10) == 0
EOF
  )
}

check versions t_versions
check pip-install t_pip_install
# the pytest suite's own tests count one each (as deploy/test.sh counts tests/python)
t0=$SECONDS
if t_pip_pytest >"$tmp/pip-pytest.log" 2>&1; then rc=0; else rc=1; fi
line=$(tail -n 1 "$tmp/pytest.out" 2>/dev/null)
ok=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
bad=$(( $(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+' || echo 0) + \
        $(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+' || echo 0) ))
passed=$((passed + ${ok:-0}))
failed=$((failed + bad))
if [ $rc -ne 0 ]; then
  sed 's/^/    /' "$tmp/pip-pytest.log" | tail -80
  [ "$bad" -eq 0 ] && failed=$((failed + 1))
  echo "pip-pytest: FAIL ($line)"
else
  echo "pip-pytest: OK ($((SECONDS - t0)) s) ($line, counted one each)"
fi
check wheel-build t_wheel_build
check wheel-install t_wheel_install

checks_done
