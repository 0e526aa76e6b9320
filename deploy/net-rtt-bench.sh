#!/usr/bin/env bash
# The tcp path at a real round-trip time (docs/benchmarks.md "At a real round-trip time"):
# master, owner and client each in a network namespace of the net test bed, kvpool-bench
# data from the client (tcp, 4 KiB x 128 and 1 MiB x 32) next to a 2-stream socket pump to
# the owner's host, with no added RTT, then 0, 100 us and 1 ms added by the bed's delaying
# proxy (tests/net/netdelay.c: this kernel has no netem). Needs root, iproute2, nftables
# and a build (default: build). JSON lines go to OUT (default: BUILD/net-rtt.jsonl).
#   deploy/net-rtt-bench.sh [BUILD] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
out=${2:-$dir/net-rtt.jsonl}
[ "$(id -u)" = 0 ] || { echo "net-rtt-bench: network namespaces need root" >&2; exit 1; }
py=$(deploy/pick-python.sh "$dir")
PYTHONPATH=$dir/client/python PYTHONDONTWRITEBYTECODE=1 \
  exec "$py" tests/net/rtt_bench.py --build "$dir" --json "$out"
