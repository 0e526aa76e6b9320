#!/usr/bin/env bash
# deploy/bench-rdma.sh - the rdma target of issue 4, in one Soft-RoCE VM
# session (tests/rdma/rxe-vm.sh): perftest's ib_write_bw and ib_read_bw with
# 1 MiB messages on rxe0, then `kvpool-bench data --transport rdma` with 1 MiB
# objects (a master and one segment owner in the same guest), its puts
# compared with ib_write_bw and its gets with ib_read_bw.
#
#   deploy/bench-rdma.sh [OUTDIR]     (default build-rdma/)
#
# Then the memory windows of issue 25 (KVPOOL_RDMA_WINDOWS): with TLS and data grants on,
# 4 KiB x 128 and 1 MiB x 8 over rdma, the owner serving one rkey (whole-segment principals
# only) against serving through windows (a BIND round trip to the owner's data server per
# batch, an UNBIND after it), three rounds alternated.
#
# Then `kvpool-bench te --transport rdma` (the transfer engine's rdma route) against
# ib_write_bw: OUTDIR/bench-rdma-te.json.
#
# Writes OUTDIR/bench-rdma.json (kvpool-bench's JSON, limits included),
# OUTDIR/bench-rdma-windows-{off,on}-N.json and OUTDIR/bench-rdma.txt (perftest's and
# kvpool-bench's output). Under TCG
# (no hardware KVM) the absolute figures are those of an emulated CPU (tens
# of MB/s): what compares is kvpool against perftest on the same device.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-build-rdma}")
mkdir -p "$OUT" build-rdma
[ -f build-rdma/build.ninja ] || meson setup build-rdma >/dev/null
ninja -C build-rdma >/dev/null
tests/rdma/rxe-vm.sh build
tls=build-rdma/bench-tls
if [ ! -f "$tls/acl.conf" ]; then # the guest has no openssl tool: made here, read there
  deploy/make-certs.sh "$tls" admin >/dev/null
  printf '[principal admin]\nroles = read, write, segment, admin\ncert-cn = admin\n' >"$tls/acl.conf"
fi

cat >build-rdma/bench-rdma-guest.sh <<'EOF'
# runs inside the guest: $1 = output dir
set -u
out=$1
G=$RXE_GID_INDEX
bw() { # verb: prints GB/s (10^9 B/s) of 1 MiB messages, one QP, perftest defaults
  local verb=$1 port=$2
  "ib_${verb}_bw" -d "$RXE_DEV" -x "$G" -s 1048576 -n 200 -p "$port" \
    >"$out/perftest-$verb-server.txt" 2>&1 &
  local srv=$!
  sleep 1
  "ib_${verb}_bw" -d "$RXE_DEV" -x "$G" -s 1048576 -n 200 -p "$port" 127.0.0.1 \
    >"$out/perftest-$verb.txt" 2>&1
  wait "$srv"
  # the result row: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]",
  # perftest's MB being 2^20 bytes
  awk '$1 == 1048576 && NF >= 5 { printf "%.6f\n", $4 * 1048576 / 1e9 }' "$out/perftest-$verb.txt" | tail -n 1
}
w=$(bw write 18515)
r=$(bw read 18516)
echo "perftest ib_write_bw 1 MiB: $w GB/s"
echo "perftest ib_read_bw  1 MiB: $r GB/s"
[ -n "$w" ] && [ -n "$r" ] || { cat "$out"/perftest-*.txt; exit 1; }
build-rdma/client/kvpool-bench data --local --transport rdma --segment-size 256MiB \
  --sizes 1MiB --batch 8 --duration 4 --no-crc \
  --rdma-write-limit "$w" --rdma-read-limit "$r" --json "$out/bench-rdma.json" --quiet
# the transfer engine's rdma route (issue 48): the connector's batch_transfer_sync_write
# against ib_write_bw
build-rdma/client/kvpool-bench te --transport rdma --sizes 64KiB,1MiB,4MiB --batch 32,128 \
  --duration 3 --rdma-write-limit "$w" --json "$out/bench-rdma-te.json"
for round in 1 2 3; do
  for mode in off on; do
    if [ "$mode" = on ]; then export KVPOOL_RDMA_WINDOWS=unbounded; else unset KVPOOL_RDMA_WINDOWS; fi
    for pt in "4KiB 128" "1MiB 8"; do
      set -- $pt
      echo "== windows $mode, round $round: $1 x $2 (TLS, data grants on)"
      build-rdma/client/kvpool-bench data --local --transport rdma --segment-size 256MiB \
        --tls-dir build-rdma/bench-tls --sizes "$1" --batch "$2" --duration 3 \
        --json "$out/bench-rdma-windows-$mode-$round-$1.json" --quiet
    done
  done
done
unset KVPOOL_RDMA_WINDOWS
EOF
tests/rdma/rxe-vm.sh run bash build-rdma/bench-rdma-guest.sh "$OUT" 2>&1 | tee "$OUT/bench-rdma.txt"
echo "results: $OUT/bench-rdma.json, $OUT/bench-rdma.txt"
