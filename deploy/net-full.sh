#!/usr/bin/env bash
# The whole network test bed suite (tests/net: hosts in network namespaces; links cut,
# lossy, delayed with jitter, reordered; tests/net/checker.py's verdict) at its full
# length, against build dir BUILD (default: build), as tests/net/run_net.sh and
# deploy/test.sh's run_net run it, but with the loss scenarios long: the full bed's 1 % loss
# on every link for a whole minute (KVPOOL_NET_LOSS_SECONDS=60; CI: 10 s) and the client's
# lossy links at 1 % and 5 % (KVPOOL_NET_LOSS_PCTS=1,5; CI: 1 %). Each scenario's report (a
# JSON line) is appended to BUILD/net-report.jsonl. Needs root, iproute2, nftables,
# iptables, curl and etcd (deploy/install-deps.sh), and a built BUILD: its master, CLI,
# Python module, tests/netdelay, and tests/netqueue (built when libnetfilter-queue-dev is
# installed; the reordering scenario fails without it). About 4 minutes on the 2-core CI
# machine kind. Exits with pytest's status.
#   deploy/net-full.sh [BUILD]
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
if [ "$(id -u)" != 0 ]; then
  echo "net-full: network namespaces need root" >&2
  exit 1
fi
for f in master/kvpool-master client/kvpool tests/netdelay; do
  [ -x "$dir/$f" ] || { echo "net-full: $dir/$f is not built (ninja -C $dir)" >&2; exit 1; }
done
py=$(deploy/pick-python.sh "$dir") || exit 1
echo "net-full: tests/net against $dir, 60 s of loss on every link, 1 % and 5 %;" \
  "reports in $dir/net-report.jsonl"
PYTHONPATH=$dir/client/python KVPOOL_MASTER_BIN=$dir/master/kvpool-master \
  KVPOOL_CLI_BIN=$dir/client/kvpool PYTHONDONTWRITEBYTECODE=1 \
  KVPOOL_NET_REPORT=$dir/net-report.jsonl \
  KVPOOL_NET_LOSS_SECONDS=60 KVPOOL_NET_LOSS_PCTS=1,5 \
  exec "$py" -m pytest -q -p no:cacheprovider tests/net
