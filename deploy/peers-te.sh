#!/usr/bin/env bash
# Side by side on one machine: kvpool's transfer engine (kvpool-bench te, tcp) against
# Mooncake's own (transfer_engine_bench, tcp, P2PHANDSHAKE), both on 127.0.0.1, at the same
# shapes: batch writes of runs of 64 KiB - 4 MiB, batches of 32 and 128. Within each
# repetition the two systems alternate point by point, and the one that goes first
# alternates between repetitions. Prints a Markdown table (size, batch, Mooncake GB/s,
# kvpool GB/s, kvpool / Mooncake) per repetition and writes the raw figures as JSON.
#
#   MOONCAKE_TE_BENCH=/path/to/transfer_engine_bench deploy/peers-te.sh [OUTDIR]
#
# Mooncake is not built here or in CI: docs/benchmarks.md, "Transfer engine vs Mooncake",
# says how to build its transfer_engine_bench (TCP only, no etcd, no CUDA) from source.
#
# Environment:
#   MOONCAKE_TE_BENCH  Mooncake's transfer_engine_bench (required)
#   KVPOOL_BENCH       kvpool-bench (default: build-release/client/kvpool-bench, set up with
#                      -Dbuildtype=release and built when missing, as Mooncake is -O3)
#   POINTS             "size:batch ..." in bytes (default: 64 KiB, 256 KiB and 1 MiB x 32 and
#                      128; 4 MiB x 32: kvpool-bench te skips batches over 256 MiB)
#   REPS (2)  DURATION (5 s per point per system)
#   STREAMS (2)        kvpool's KVPOOL_TE_STREAMS and Mooncake's MC_TCP_LANES_PER_PEER:
#                      TCP connections per peer (Mooncake's default is 4, kvpool's 2)
#   MC_LANES (STREAMS) Mooncake's MC_TCP_LANES_PER_PEER alone, to try Mooncake at other counts
#   MC_THREADS (1)     transfer_engine_bench's --threads: submitting threads (kvpool-bench te
#                      has one caller)
# Writes OUTDIR/peers-te.json and OUTDIR/peers-te.md (OUTDIR defaults to the repository
# root; both names are ignored by git), every process's log under OUTDIR/peers-te-logs/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${1:-$ROOT}
MC=${MOONCAKE_TE_BENCH:?set MOONCAKE_TE_BENCH to Mooncake\'s transfer_engine_bench (docs/benchmarks.md, "Transfer engine vs Mooncake")}
KB=${KVPOOL_BENCH:-$ROOT/build-release/client/kvpool-bench}
POINTS=${POINTS:-"65536:32 65536:128 262144:32 262144:128 1048576:32 1048576:128 4194304:32"}
REPS=${REPS:-2}
DURATION=${DURATION:-5}
STREAMS=${STREAMS:-2}
MC_THREADS=${MC_THREADS:-1}
MC_LANES=${MC_LANES:-$STREAMS}
LOGS=$OUT/peers-te-logs
RAW=$LOGS/raw.jsonl
mkdir -p "$LOGS"
: > "$RAW"
say() { echo "[$(date +%H:%M:%S)] $*" >&2; }

[ -x "$MC" ] || { echo "peers-te.sh: $MC is not an executable" >&2; exit 1; }
if [ ! -x "$KB" ] && [ -z "${KVPOOL_BENCH:-}" ]; then
  say "building kvpool-bench (release) in build-release"
  [ -f build-release/build.ninja ] || meson setup build-release -Dbuildtype=release >/dev/null || exit 1
  ninja -C build-release client/kvpool-bench >/dev/null || exit 1
fi
[ -x "$KB" ] || { echo "peers-te.sh: $KB is not an executable" >&2; exit 1; }

# One Mooncake point: a target process (it registers one buffer and serves), then an initiator
# process that writes batches for DURATION seconds and logs "throughput X GB/s" (GB = 1e9 B).
mc_point() { # size batch rep -> GB/s on stdout, empty on failure
  local size=$1 batch=$2 rep=$3 tlog ilog port="" tpid
  local buf=$((size * batch * MC_THREADS))
  tlog=$LOGS/mc-target-$size-$batch-r$rep.log
  ilog=$LOGS/mc-initiator-$size-$batch-r$rep.log
  GLOG_logtostderr=1 MC_TCP_LANES_PER_PEER=$MC_LANES "$MC" --mode=target \
    --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 --protocol=tcp \
    --block_size=$size --batch_size=$batch --threads=$MC_THREADS --buffer_size=$buf \
    > "$tlog" 2>&1 &
  tpid=$!
  for _ in $(seq 1 300); do # the target logs its P2P port once its RPC server listens
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$tlog" | head -1)
    [ -n "$port" ] && break
    kill -0 $tpid 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    say "mooncake target did not start ($tlog)"; kill -9 $tpid 2>/dev/null; wait $tpid 2>/dev/null
    return
  fi
  sleep 1 # its buffer is registered right after the transport is installed
  GLOG_logtostderr=1 MC_TCP_LANES_PER_PEER=$MC_LANES timeout $((DURATION + 60)) "$MC" \
    --mode=initiator --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 \
    --protocol=tcp --segment_id=127.0.0.1:$port --operation=write --block_size=$size \
    --batch_size=$batch --threads=$MC_THREADS --duration=$DURATION --buffer_size=$buf \
    --report_unit=GB --report_precision=3 > "$ilog" 2>&1
  kill -TERM $tpid 2>/dev/null
  for _ in $(seq 1 50); do kill -0 $tpid 2>/dev/null || break; sleep 0.1; done
  kill -9 $tpid 2>/dev/null
  wait $tpid 2>/dev/null
  sed -n 's/.*throughput \([0-9.][0-9.]*\) GB\/s.*/\1/p' "$ilog" | tail -1
}

kv_point() { # size batch rep -> "GB/s pump-GB/s" on stdout (the pump: limits' 2-stream socket
  # pump of this size, measured by the same run), empty on failure
  local size=$1 batch=$2 rep=$3 log=$LOGS/kvpool-$1-$2-r$3.log json=$LOGS/kvpool-$1-$2-r$3.json
  KVPOOL_TE_STREAMS=$STREAMS timeout $((DURATION + 120)) "$KB" te --transport tcp --sizes "$size" \
    --batch "$batch" --duration "$DURATION" --json "$json" > "$log" 2>&1 || return
  python3 - "$json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = [r for r in doc.get("results", []) if r.get("mode", "te") == "te" and "gbps" in r]
if rows:
    print("%.3f %.3f" % (rows[-1]["gbps"], rows[-1].get("limit_gbps", 0)))
EOF
}

record() { # system size batch rep gbps [pump-gbps]
  printf '{"system":"%s","size":%s,"batch":%s,"rep":%s,"gbps":%s,"tcp_pump_gbps":%s}\n' "$1" \
    "$2" "$3" "$4" "${5:-null}" "${6:-null}" >> "$RAW"
}

say "Mooncake: $MC; kvpool: $KB; points: $POINTS; $REPS repetitions of $DURATION s; TCP connections per peer: kvpool $STREAMS, Mooncake $MC_LANES; Mooncake submitting threads: $MC_THREADS"
failed=0
for rep in $(seq 1 "$REPS"); do
  for p in $POINTS; do
    size=${p%%:*} batch=${p##*:}
    if [ $((rep % 2)) = 1 ]; then order="mooncake kvpool"; else order="kvpool mooncake"; fi
    for sys in $order; do
      pump=""
      if [ "$sys" = mooncake ]; then
        g=$(mc_point "$size" "$batch" "$rep")
      else
        read -r g pump <<< "$(kv_point "$size" "$batch" "$rep")"
      fi
      [ -n "$g" ] || { say "$sys $size x $batch (rep $rep) FAILED: see $LOGS"; failed=1; }
      say "rep $rep  $sys  $((size >> 10)) KiB x $batch  ${g:-FAILED} GB/s"
      record "$sys" "$size" "$batch" "$rep" "$g" "$pump"
    done
  done
done

python3 - "$RAW" "$OUT/peers-te.json" "$OUT/peers-te.md" "$REPS" "$DURATION" "$STREAMS" "$MC_THREADS" \
  "$(git rev-parse --short HEAD)" "$(nproc)" "$(uname -r)" "$MC_LANES" <<'EOF'
import json, sys
raw, out_json, out_md, reps, duration, streams, mc_threads, commit, nproc, kernel, mc_lanes = sys.argv[1:12]
rows = [json.loads(l) for l in open(raw) if l.strip()]
reps = int(reps)
cpu = ""
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"):
        cpu = l.split(":", 1)[1].strip()
        break
points = []
for r in rows:
    k = (r["size"], r["batch"])
    if k not in points:
        points.append(k)
def g(sys_, k, rep, field="gbps"):
    for r in rows:
        if r["system"] == sys_ and (r["size"], r["batch"]) == k and r["rep"] == rep:
            return r[field]
    return None
def size_s(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)
table = []
lines = ["| size x batch | " + " | ".join(
    "rep %d: Mooncake GB/s | kvpool GB/s | kvpool / Mooncake" % r for r in range(1, reps + 1))
    + " | lowest ratio |", "|---" * (1 + 3 * reps + 1) + "|"]
for k in points:
    cells, ratios = [], []
    entry = {"size": k[0], "batch": k[1], "reps": []}
    for rep in range(1, reps + 1):
        m, v = g("mooncake", k, rep), g("kvpool", k, rep)
        ratio = v / m if m and v else None
        entry["reps"].append({"rep": rep, "mooncake_gbps": m, "kvpool_gbps": v, "ratio": ratio,
                              "tcp_pump_gbps": g("kvpool", k, rep, "tcp_pump_gbps")})
        if ratio is not None:
            ratios.append(ratio)
        cells += ["%.2f" % m if m else "-", "%.2f" % v if v else "-",
                  ("**%.2f**" if ratio < 1.1 else "%.2f") % ratio if ratio is not None else "-"]
    entry["min_ratio"] = min(ratios) if len(ratios) == reps else None
    entry["meets_1_1x"] = entry["min_ratio"] is not None and entry["min_ratio"] >= 1.1
    table.append(entry)
    lines.append("| %s x %d | %s | %s |" % (size_s(k[0]), k[1], " | ".join(cells),
                 "%.2f" % entry["min_ratio"] if entry["min_ratio"] is not None else "-"))
meta = {"commit": commit, "nproc": int(nproc), "kernel": kernel, "cpu": cpu, "reps": reps,
        "duration_s": float(duration), "kvpool_tcp_streams": int(streams),
        "mooncake_tcp_lanes_per_peer": int(mc_lanes),
        "mooncake_threads": int(mc_threads), "op": "batch write (kvpool: batch_transfer_sync_write"
        "; Mooncake: submitTransfer + getTransferStatus polling)", "target_ratio": 1.1}
json.dump({"meta": meta, "points": table, "raw": rows}, open(out_json, "w"), indent=1)
md = "\n".join(lines) + "\n"
open(out_md, "w").write(md)
print(md, end="")
print("bold: under the 1.1x asked. JSON: %s" % out_json)
EOF
exit $failed
