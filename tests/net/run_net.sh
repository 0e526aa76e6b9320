#!/usr/bin/env bash
# tests/net (hosts in network namespaces, partitions, the checker) under pytest, against
# build dir BUILD (default: build); each scenario's report (a JSON line) goes to
# BUILD/net-report.jsonl. Needs root, iproute2, nftables, curl and etcd; without root it
# exits 77 (meson: SKIP), so a run that could not make namespaces never passes as one
# that did. `meson test -C build --suite net` runs it; deploy/test.sh runs the same tests.
#   tests/net/run_net.sh [BUILD]
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build}
if [ "$(id -u)" != 0 ]; then
  echo "run_net: network namespaces need root: SKIP"
  exit 77
fi
py=$(deploy/pick-python.sh "$dir") || exit 1
PYTHONPATH=$dir/client/python KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
  KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
  KVPOOL_NET_REPORT=$dir/net-report.jsonl \
  exec "$py" -m pytest -q -p no:cacheprovider tests/net
