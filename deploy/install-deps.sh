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
  # common/etcd.c (JSON) and the etcd that test_etcd starts (HA: leader election)
  libcjson-dev etcd-server etcd-client
  clang-format
  # deploy/fuzz.sh: clang-14 with libFuzzer and the sanitizer runtimes
  # (libclang_rt.fuzzer/asan/ubsan, not pulled in without recommends), and
  # llvm-symbolizer (package llvm) for symbolized crash stacks
  clang libclang-rt-14-dev llvm
  # the Python module (client/python) and its pytest suite (tests/python)
  python3-dev python3-pytest python3-numpy
)

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
