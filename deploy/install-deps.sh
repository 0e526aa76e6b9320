#!/usr/bin/env bash
# Install every build and test dependency of kvpool from Debian's archive.
# Idempotent: quiet and quick when everything is already there.
set -euo pipefail

PKGS=(
  meson ninja-build pkg-config gcc
  protobuf-c-compiler libprotobuf-c-dev
  libjemalloc-dev libcmocka-dev libxxhash-dev
  libcurl4-openssl-dev libibverbs-dev librdmacm-dev
  liburing-dev
  # TLS 1.3 and token hashes on the control plane (common/tls.c, master/auth/); the
  # openssl tool makes certificates (deploy/make-certs.sh, the security tests)
  libssl-dev openssl
  # the etcd that test_etcd starts (HA: leader election)
  etcd-server etcd-client
  clang-format
  # deploy/fuzz.sh: clang-14 with libFuzzer and the sanitizer runtimes
  # (libclang_rt.fuzzer/asan/ubsan, not pulled in without recommends), and
  # llvm-symbolizer (package llvm) for symbolized crash stacks
  clang libclang-rt-14-dev llvm
  # the Python module (client/python) and its pytest suite (tests/python)
  python3-dev python3-pytest python3-numpy
  # the suite's tests in two processes (deploy/test.sh: pytest -n 2)
  python3-pytest-xdist
  # mooncake.store's tensor API and its tests (tests/python/test_tensor.py): Debian's
  # CPU build of torch (~50 MB installed, ~170 packages with its libraries)
  python3-torch
  # pip install . / python3 -m build --wheel without a package index (tests/pip): the
  # build backend meson-python, the build frontend, venv, and patchelf (meson-python
  # sets the rpath of the extension to the libkvpool bundled in the wheel)
  python3-mesonpy python3-build python3-venv patchelf
  # operations: HTTP (/metrics, admin views), KV events (ZeroMQ + msgpack), config files
  libmicrohttpd-dev libzmq3-dev libmsgpack-dev libinih-dev
  # their tests: a real Prometheus (and promtool), a Python KV-event subscriber; the
  # indexer's reference model hashes by the standard (XXH3-64: python3-xxhash)
  prometheus python3-zmq python3-msgpack python3-xxhash
  # tests/deploy (deploy/, debian/): the Debian package's build (dpkg-buildpackage,
  # debhelper, make and gcc through build-essential), systemd-analyze for the
  # units, python3-yaml for the manifests, curl for the daemons' HTTP
  build-essential dpkg-dev debhelper systemd python3-yaml curl
  # tests/net: hosts in network namespaces (ip netns, veth, a bridge) and cut links;
  # packet delay, jitter and reordering through NFQUEUE (tests/net/netqueue.c: the kernel
  # has no netem; iptables-legacy's NFQUEUE target, nftables' own queue is not built in)
  iproute2 nftables iptables libnetfilter-queue-dev
)
# kubectl for the manifests' dry run: Debian's kubernetes-client, unless a
# kubectl is installed already (another package's kubectl conflicts with it,
# and apt would remove that one).
command -v kubectl >/dev/null 2>&1 || PKGS+=(kubernetes-client)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
