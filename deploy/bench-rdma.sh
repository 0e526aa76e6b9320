#!/usr/bin/env bash
# deploy/bench-rdma.sh - the rdma targets, in one Soft-RoCE VM
# session (tests/rdma/rxe-vm.sh): perftest's ib_write_bw and ib_read_bw with
# 1 MiB messages on rxe0, then `kvpool-bench data --transport rdma` with 1 MiB
# objects (a master and one segment owner in the same guest), its puts
# compared with ib_write_bw and its gets with ib_read_bw.
#
#   deploy/bench-rdma.sh [OUTDIR]     (default build-rdma/)
#
# Then the memory windows (KVPOOL_RDMA_WINDOWS): with TLS and data grants on,
# 4 KiB x 128 and 1 MiB x 8 over rdma, the owner serving one rkey (whole-segment principals
# only) against serving through windows (a BIND round trip to the owner's data server per
# batch, an UNBIND after it), three rounds alternated.
#
# Then `kvpool-bench te --transport rdma` (the transfer engine's rdma route, its
# target: >= 85 % of ib_write_bw) at the connector's shapes, runs of 64 KiB, 1 MiB and
# 4 MiB in batches of 32 and 128 (4 MiB x 32 only: the guest has 1 GiB), two repetitions:
# each point between two ib_write_bw runs of its own message size (one queue pair,
# perftest's defaults), its limit the one before, the one after printed beside it, so that
# the emulated CPU's drift shows: OUTDIR/bench-rdma-te-SIZE-BATCH-REP.json and a table in
# OUTDIR/bench-rdma-te.txt.
#
#   deploy/bench-rdma.sh --te-only [OUTDIR]   the transfer engine's part alone (~5 min)
#
# Writes OUTDIR/bench-rdma.json (kvpool-bench's JSON, limits included),
# OUTDIR/bench-rdma-windows-{off,on}-N.json and OUTDIR/bench-rdma.txt (perftest's and
# kvpool-bench's output). Under TCG
# (no hardware KVM) the absolute figures are those of an emulated CPU (tens
# of MB/s): what compares is kvpool against perftest on the same device.
set -euo pipefail
cd "$(dirname "$0")/.."
TE_ONLY=0
if [ "${1:-}" = --te-only ]; then TE_ONLY=1; shift; fi
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
# runs inside the guest: $1 = output dir, $2 = 1: the transfer engine's part only
set -u
out=$1
G=$RXE_GID_INDEX
bw() { # verb port [size iterations tag]: prints GB/s (10^9 B/s), one QP, perftest defaults
  local verb=$1 port=$2 size=${3:-1048576} iters=${4:-200} tag=${5:-$1}
  "ib_${verb}_bw" -d "$RXE_DEV" -x "$G" -s "$size" -n "$iters" -p "$port" \
    >"$out/perftest-$tag-server.txt" 2>&1 &
  local srv=$!
  sleep 1
  "ib_${verb}_bw" -d "$RXE_DEV" -x "$G" -s "$size" -n "$iters" -p "$port" 127.0.0.1 \
    >"$out/perftest-$tag.txt" 2>&1
  wait "$srv"
  # the result row: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]",
  # perftest's MB being 2^20 bytes
  awk -v s="$size" '$1 == s && NF >= 5 { printf "%.6f\n", $4 * 1048576 / 1e9 }' "$out/perftest-$tag.txt" | tail -n 1
}
te_points() { # the transfer engine's rdma route against ib_write_bw of its run size
  local port=18600 pt size batch iters rep w1 w2 line
  echo "| run | batch | rep | ib_write_bw before MB/s | kvpool te MB/s | % of before | rounds | ib_write_bw after MB/s |" >"$out/bench-rdma-te.txt"
  echo "|---|---|---|---|---|---|---|---|" >>"$out/bench-rdma-te.txt"
  for pt in "65536 32 2000" "65536 128 2000" "1048576 32 200" "1048576 128 200" "4194304 32 50"; do
    set -- $pt
    size=$1 batch=$2 iters=$3
    for rep in 1 2; do
      port=$((port + 1)); w1=$(bw write $port "$size" "$iters" "write-$size-$batch-$rep-before")
      [ -n "$w1" ] || { cat "$out/perftest-write-$size-$batch-$rep-before.txt"; exit 1; }
      line=$(build-rdma/client/kvpool-bench te --transport rdma --sizes "$((size / 1024))KiB" \
        --batch "$batch" --duration 3 --rdma-write-limit "$w1" \
        --json "$out/bench-rdma-te-$size-$batch-$rep.json" | grep -E '^  rdma ') || exit 1
      echo "$line"
      port=$((port + 1)); w2=$(bw write $port "$size" "$iters" "write-$size-$batch-$rep-after")
      echo "$line" | awk -v s=$((size / 1024)) -v b="$batch" -v r="$rep" -v w1="$w1" -v w2="$w2" '
        { for (i = 1; i <= NF; i++) {
            if ($i == "rounds") ro = $(i + 1) " / " $(i + 2) " / " $(i + 3) " / " $(i + 4)
            if ($i == "ib_write_bw") p = $(i + 1) }
          printf "| %d KiB | %d | %d | %.1f | %.1f | %s %% | %s | %.1f |\n", s, b, r, w1 * 1000, p * w1 * 10, p, ro, w2 * 1000 }' \
        >>"$out/bench-rdma-te.txt"
    done
  done
  cat "$out/bench-rdma-te.txt"
}
if [ "${2:-0}" = 1 ]; then te_points; exit 0; fi
w=$(bw write 18515)
r=$(bw read 18516)
echo "perftest ib_write_bw 1 MiB: $w GB/s"
echo "perftest ib_read_bw  1 MiB: $r GB/s"
[ -n "$w" ] && [ -n "$r" ] || { cat "$out"/perftest-*.txt; exit 1; }
build-rdma/client/kvpool-bench data --local --transport rdma --segment-size 256MiB \
  --sizes 1MiB --batch 8 --duration 4 --no-crc \
  --rdma-write-limit "$w" --rdma-read-limit "$r" --json "$out/bench-rdma.json" --quiet
# the transfer engine's rdma route: the connector's batch_transfer_sync_write
# against ib_write_bw of each run size
te_points
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
tests/rdma/rxe-vm.sh run bash build-rdma/bench-rdma-guest.sh "$OUT" "$TE_ONLY" 2>&1 | tee "$OUT/bench-rdma.txt"
echo "results: $OUT/bench-rdma.json, $OUT/bench-rdma.txt"
