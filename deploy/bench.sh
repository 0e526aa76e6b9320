#!/usr/bin/env bash
# Run kvpool-bench's standard set on this machine (about 25 minutes on 2 cores)
# and write bench-results.json plus a short Markdown summary
# (bench-results.md): every figure docs/benchmarks.md's "The standard run" quotes
# except the RDMA table (deploy/bench-rdma.sh) and the outside references
# (Redis, Mooncake). Nothing here is committed: both files are ignored.
# Every run goes ahead even when an earlier one failed; the script then
# names the failed runs and exits non-zero (their figures, where the bench
# got that far, are still in the results).
#
#   deploy/bench.sh [OUTDIR]        (default: the repository root)
#   KVPOOL_TRACE=FILE               the trace (default ../shared/traces/synthetic_trace.jsonl)
#   KVPOOL_SSD_DIR=DIR              where the disk test file and SSD segment files go (default
#                                   build/; must be on a disk filesystem, never tmpfs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-$ROOT}
mkdir -p "$OUT"

deploy/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
BENCH=$ROOT/build/client/kvpool-bench
TRACE=${KVPOOL_TRACE:-$ROOT/../shared/traces/synthetic_trace.jsonl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()
# The SSD tier's files (limits' 1 GiB disk test file, the ssd mode's 2 GiB segment, the tiered
# trace's 1.4 GiB segment; one at a time, each removed after) must be on a disk: O_DIRECT on
# tmpfs measures memory. The build directory is; /tmp may not be.
SSD_DIR=${KVPOOL_SSD_DIR:-$ROOT/build}
if [ "$(stat -f -c %T "$SSD_DIR")" = tmpfs ] || [ "$(stat -f -c %T "$SSD_DIR")" = ramfs ]; then
  echo "bench.sh: $SSD_DIR is on $(stat -f -c %T "$SSD_DIR"): set KVPOOL_SSD_DIR to a directory on a disk" >&2
  exit 1
fi

run() { # name, args...
  local name=$1; shift
  echo "== kvpool-bench $*" >&2
  if ! "$BENCH" "$@" --json "$tmp/$name.json"; then
    echo "== kvpool-bench $name FAILED" >&2
    failed+=("$name")
  fi
}

run limits limits --sizes 4KiB,64KiB,1MiB,4MiB,16MiB --ssd-dir "$SSD_DIR"
# Footprints stay under ~2.5 GiB in all: on this machine kind, touching more memory than
# that makes every access ~25x slower (docs/benchmarks.md, "Memory footprint").
run data   data --local --segment-size 1GiB --sizes 4KiB,64KiB,1MiB,4MiB,16MiB --batch 32 --no-crc
run data4k data --local --segment-size 256MiB --sizes 4KiB --batch 128
# Threads on one client: 4 threads sharing one client against 1 thread (targets:
# batch_is_exist of 32 keys >= 1.8x; 1 MiB gets over tcp >= 1x, no collapse), and 4 threads
# with a client each for comparison. About 17 s (6 + 11).
run threads_exist data --local --segment-size 256MiB --transport tcp --sizes 4KiB --batch 32 \
  --threads 1,4 --clients both --loop exist
run threads_get data --local --segment-size 1GiB --transport tcp --sizes 1MiB --batch 32 \
  --threads 1,4 --clients both --loop get
# The SSD tier next to the disk's own figures measured in the same run: get_ssd (1024 x 1 MiB
# put straight to SSD, read back in random batches of 32; target 85 % of disk_read), get_dram,
# offload (256 MiB DRAM, 2 GiB SSD: ~1.9 GiB put; target 80 % of disk_write). About 20 s.
run ssd    ssd --local --ssd-dir "$SSD_DIR"
# The DFS tier: a DFS segment in a directory of $SSD_DIR (standing in for the shared
# file system); 1 MiB objects put without and with a DFS replica (through the DFS owner, and
# by a client that writes the shard file itself), then read back from DFS once the DRAM owner
# is killed (through the owner, and in the file). 256 objects per point. About 5 s.
run dfs    dfs --ssd-dir "$SSD_DIR" --segment-size 1GiB --ssd-size 1GiB --ssd-objects 256
# Multi-buffer gets and the Python module. pieces: 32 objects of 1 MiB put and got
# as one buffer each and as 64 pieces of 16 KiB (kvp_batch_*_multi), shm and tcp; target: the
# 64-piece get >= 0.8x the 1-piece get. python: deploy/py-bench.py, the `kvpool` module against
# kvpool-bench on one master of its own, interleaved (Python, C, Python, C, ...): batch_get_into
# of 32 x 1 MiB over shm and tcp (target >= 0.9x C), batch_exists of 128 keys (>= 0.8x).
# About 15 s + 60 s.
run pieces data --local --segment-size 1GiB --sizes 1MiB --batch 32 --pieces 1,64
pybench_py=""
for cand in python3 /usr/bin/python3; do
  if PYTHONPATH=build/client/python "$cand" -c 'import numpy, kvpool' >/dev/null 2>&1; then
    pybench_py=$cand; break
  fi
done
echo "== deploy/py-bench.py" >&2
if [ -z "$pybench_py" ]; then
  echo "== py-bench: no python3 imports numpy and build/client/python (deploy/install-deps.sh)" >&2
  failed+=(python)
elif ! PYTHONPATH=build/client/python "$pybench_py" deploy/py-bench.py --build build \
    --json "$tmp/python.json"; then
  echo "== py-bench FAILED" >&2
  failed+=(python)
fi
run alloc  alloc
# Security: TLS 1.3 and an ACL on the control plane (--tls-dir: certificates from
# deploy/make-certs.sh, one admin principal), each point next to its plain twin in pairs run
# back to back, the order flipped every pair (plain TLS, TLS plain, ...) so that a machine
# speeding up or slowing down through the run favours neither: tcp 4 KiB batch-128 puts and
# gets, and 1 MiB batch-32 (with TLS every tcp data request carries the master's grant and
# each new data connection proves its principal; the master's RPCs are TLS), six
# pairs each; BatchExist and puts at 1 M resident (meta: 2 threads, one connection each, with
# the CPU the master and the clients spent per 1000 keys), and a connection's cost with its
# handshake, four pairs. Also shm 4 KiB (with TLS the owner hands its segment over to the
# admin), six pairs, and tcp 4 KiB with TLS but --data-grants off (what the grants
# cost, beside what TLS costs), run after each pair's TLS run. A pair's two runs follow each
# other, so a slow minute of the machine moves one pair, not one side of all of them.
# Target: the median of a point's pairs' TLS/plain >= 0.9x (1 MiB: >= 0.97x). About 9 minutes.
tls_dir=$tmp/tls
sec_point() { # kind, pairs, kvpool-bench args...
  local kind=$1 pairs=$2 round mode order
  shift 2
  for round in $(seq 1 "$pairs"); do
    order="plain tls"
    [ $((round % 2)) = 0 ] && order="tls plain"
    for mode in $order; do
      extra=()
      [ "$mode" = tls ] && extra=(--tls-dir "$tls_dir")
      run "sec_${kind}_${mode}_$round" "$@" "${extra[@]}"
      if [ "$mode" = tls ] && [ "$kind" = tcp4k ]; then
        run "sec_tcp4k_tlsnogrants_$round" "$@" "${extra[@]}" --data-grants off
      fi
    done
  done
}
if deploy/make-certs.sh "$tls_dir" admin >/dev/null 2>&1; then
  printf '[principal admin]\nroles = read, write, segment, admin\ncert-cn = admin\n' >"$tls_dir/acl.conf"
  sec_point tcp4k 6 data --local --segment-size 256MiB --transport tcp --sizes 4KiB --batch 128
  sec_point tcp1m 6 data --local --segment-size 1GiB --transport tcp --sizes 1MiB --batch 32 \
    --duration 1
  sec_point shm4k 6 data --local --segment-size 256MiB --transport shm --sizes 4KiB --batch 128
  sec_point meta1m 4 meta --local --objects 1000000
else
  echo "== deploy/make-certs.sh FAILED: no TLS points" >&2
  failed+=(tls)
fi
# Metadata that survives the master and HA: the put rate with segment records on
# vs off, the rebuild of 1M objects on 4 segments after a kill -9 of the master (time and
# master RSS), and 10 kills of the leader among 3 masters with etcd (--leader-ttl 2): time to
# the first put acknowledged after each kill, the client's rate through it. About 90 s.
run ha     ha
# The same with TLS 1.3 and an ACL on every master (failover time should not change).
[ -f "$tls_dir/acl.conf" ] && run ha_tls ha --tls-dir "$tls_dir"
run meta   meta --local --objects 10000,1000000,10000000
# The trace replays through the store (--eviction store): per capacity point a fresh master
# and one segment of exactly capacity x unique blocks x block size (64 KiB at 0.25: ~690 MiB),
# next to exact LRU and Belady simulated in the bench.
if [ -f "$TRACE" ]; then
  run trace4k  trace --local --block-bytes 4KiB --trace "$TRACE" --capacity 0.05,0.1,0.25
  run trace64k trace --local --block-bytes 64KiB --trace "$TRACE" --capacity 0.05,0.1,0.25
  # Tiers: DRAM 5 % and SSD 50 % of the unique blocks (137 MiB + a 1.4 GiB SSD file). 64 KiB
  # blocks: the SSD file has one object-table slot per 64 KiB, so 4 KiB blocks would not fit.
  run trace_tiers trace --local --block-bytes 64KiB --trace "$TRACE" --capacity 0.05 \
    --ssd-capacity 0.5 --ssd-dir "$SSD_DIR"
else
  echo "no trace at $TRACE (set KVPOOL_TRACE): skipping the trace mode" >&2
fi
# kvpool-indexer: the trace through 16 mock engines of 16384 blocks of 16 tokens,
# in process on one core (limit >= 10 M block ops/s) next to a naive baseline, end to end
# through ZeroMQ into a kvpool-indexer of its own (>= 2 M block events/s), POST /query of
# 8192 tokens against 64 instances (p99 <= 1 ms) and the daemon's RSS at 10 M (block,
# instance) pairs (<= 64 B each), one holder per block and four. About a minute.
if [ -f "$TRACE" ]; then
  run index index --trace "$TRACE"
else
  run index index --class conversation --requests 4000
fi
# Copy and move tasks: 256 MiB of 64 KiB, 1 MiB and 4 MiB objects put on one of 3
# segments of a cluster of its own per transport, then copied to a second and moved to a
# third by tasks their owner runs, every byte read back. Under a minute.
run tasks tasks --sizes 64KiB,1MiB,4MiB
# The transfer engine: batch_transfer_sync_write of vLLM's MooncakeConnector shapes
# (runs of 64 KiB - 4 MiB, batches of 32 - 512, at most 256 MiB a batch) from this process into
# a second one's registered, resident memory, over tcp and shm; each point's limit measured in
# 4 rounds interleaved with it (a slice of each back to back, the order flipped every round):
# tcp the 2-stream socket pump (target >= 0.90x), shm memcpy of the same bytes (target >=
# 0.85x), checked on the rounds' median. About 60-70 s.
run te te --duration 1
# Workload classes: kvpool-bench tracegen writes 4000 requests of each class (seed
# 1; the classes and their sources: docs/benchmarks.md, "Workload classes"), each replayed
# with 4 KiB blocks at 2-50 % of its unique blocks, unpaced, and the trace above at 2 and 50 %
# (5-25 % are trace4k's). The pace: each class's 2000-request test slice (and the FAST'25 one)
# at 10 %, unpaced and at its timestamps sped up 100x, with one client and with 4. About
# 4-5 minutes on 2 cores.
GEN=$ROOT/build/bench-traces
mkdir -p "$GEN"
for c in conversation toolagent sysprompt rag; do
  run "tracegen_$c" tracegen --class "$c" --requests 4000 --seed 1 --out "$GEN/$c.jsonl"
  run "class_$c" trace --local --block-bytes 4KiB --trace "$GEN/$c.jsonl" \
    --capacity 0.02,0.05,0.1,0.25,0.5
done
[ -f "$TRACE" ] && run class_synthetic trace --local --block-bytes 4KiB --trace "$TRACE" \
  --capacity 0.02,0.5
for s in fast25_trace conversation toolagent sysprompt rag; do
  for n in 1 4; do
    run "pace${n}_$s" trace --local --segment-size 256MiB --block-bytes 4KiB \
      --trace "$ROOT/tests/unit/master/data/${s}_2000.jsonl" --capacity 0.1 --pace 0,100 \
      --trace-clients "$n"
  done
done

# Merge: one machine/params header (from the data run), every result.
python3 - "$tmp" "$OUT/bench-results.json" "$OUT/bench-results.md" "$ROOT" <<'PY'
import json, sys, glob, os
tmp, out_json, out_md, root = sys.argv[1:5]
def unplaced(v):  # no machine paths in the results: the tree's relative, others' base name
    if isinstance(v, dict):
        return {k: unplaced(x) for k, x in v.items()}
    if isinstance(v, list):
        return [unplaced(x) for x in v]
    if isinstance(v, str) and os.path.isabs(v):
        rel = os.path.relpath(v, root)
        return rel if not rel.startswith("..") else os.path.basename(v)
    return v
docs = {os.path.basename(p)[:-5]: unplaced(json.load(open(p)))
        for p in sorted(glob.glob(tmp + "/*.json"))}
if not docs:
    sys.exit("no results to merge")
for name, v in docs.items():  # which run each figure came from
    for r in v["results"]:
        r["run"] = name
        pre, _, n = name.rpartition("_")
        if name.startswith("sec_") and n.isdigit():  # a TLS point's pair: run and its number
            r["run"], r["pair"] = pre, int(n)
first = docs.get("data", next(iter(docs.values())))
merged = {"machine": first["machine"],
          "params": {k: v["params"] for k, v in docs.items()},
          "results": [r for v in docs.values() for r in v["results"]]}
json.dump(merged, open(out_json, "w"), indent=1)
R = merged["results"]
md = ["# kvpool-bench results", "",
      "Machine: %s, %d cores, %.0f GiB; idle CPUs: %s%s." % (
          first["machine"]["cpu"], first["machine"]["cores"], first["machine"]["mem_bytes"] / 2**30,
          first["machine"].get("cpuidle_driver", "unknown"),
          ", guest_halt_poll_ns %d" % first["machine"]["guest_halt_poll_ns"]
          if first["machine"].get("guest_halt_poll_ns", -1) >= 0 else ""), ""]
md += ["## data (% of ws: of the tcp pump cycling through a batch's buffers)", "",
       "| transport | op | size | batch | crc | GB/s | % of limit | % of ws | obj/s | p50 us | p99 us | p99.9 us |",
       "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in R:
    if (r["mode"] == "data" and r.get("loop", "none") == "none" and r["run"] != "pieces"
            and not r["run"].startswith("sec_")):
        md.append("| %s | %s | %d | %d | %s | %.2f | %.0f%% | %s | %.0f | %.0f | %.0f | %.0f |" % (
            r["transport"], r["op"], r["size"], r["batch"], r["crc"], r["gbps"],
            r["pct_of_limit"],
            ("%.0f%%" % r["pct_of_ws_limit"]) if r.get("pct_of_ws_limit", 0) > 0 else "-",
            r["objs_per_s"], r["p50_us"], r["p99_us"], r["p999_us"]))
md += ["", "## threads on one client (--loop: only that op repeated; x1: ratio to one thread)", "",
       "| transport | op | size | batch | threads | clients | obj/s | GB/s | x1 | target | met |",
       "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in R:
    if r["mode"] == "data" and r.get("loop", "none") != "none":
        md.append("| %s | %s | %d | %d | %d | %s | %.0f | %.2f | %.2f | %s | %s |" % (
            r["transport"], r["op"], r["size"], r["batch"], r["threads"], r["clients"],
            r["objs_per_s"], r["gbps"], r["ratio_to_1_thread"],
            (">= %.1fx" % r["target_ratio"]) if r["target_ratio"] > 0 else "-", r["target_met"]))
py = [r for r in R if r["mode"] == "python"]
pcs = [r for r in R if r["mode"] == "data" and r["run"] == "pieces"]
if py or pcs:
    md += ["", "## Python module and multi-buffer gets", ""]
if py:
    md += ["The `kvpool` module against kvpool-bench on the same master, interleaved "
           "(obj/s of time in the call; rounds: Python/C per round).", "",
           "| op (Python call) | transport | size | batch | Python obj/s | C obj/s | Python/C | rounds | Python p50 us | C p50 us | target | met |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in py:
        md.append("| %s (%s) | %s | %d | %d | %.0f | %.0f | %.2f | %s | %.0f | %.0f | >= %.1fx | %s |" % (
            r["op"], r["py_call"], r["transport"], r["size"], r["batch"], r["py_objs_per_s"],
            r["c_objs_per_s"], r["ratio"], " ".join("%.2f" % x for x in r["round_ratios"]),
            r["py_p50_us"], r["c_p50_us"], r["target_ratio"], r["target_met"]))
if pcs:
    md += ["", "Objects of `size` as `pieces` equal buffers (kvp_batch_put_from_multi / "
           "kvp_batch_get_into_multi; exist unchanged); x1 piece: ratio to the 1-piece rate.", "",
           "| transport | op | size | batch | pieces | piece bytes | GB/s | obj/s | p50 us | x1 piece | target | met |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in pcs:
        if r["op"] == "exist":
            continue
        md.append("| %s | %s | %d | %d | %d | %d | %.2f | %.0f | %.0f | %s | %s | %s |" % (
            r["transport"], r["op"], r["size"], r["batch"], r["pieces"], r["piece_bytes"],
            r["gbps"], r["objs_per_s"], r["p50_us"],
            ("%.2f" % r["ratio_to_1_piece"]) if r["pieces"] > 1 else "-",
            (">= %.1fx" % r["target_ratio"]) if r["target_field"] == "ratio_to_1_piece" else "-",
            r["target_met"] if r["target_field"] == "ratio_to_1_piece" else "n/a"))
md += ["", "## limits (disk_*: io_uring O_DIRECT, 1 MiB blocks, queue depth in the streams column)", "",
       "| limit | size | streams | GB/s |", "|---|---|---|---|"]
for r in R:
    if r["mode"] == "limits" and "gbps" in r:
        md.append("| %s | %s | %s | %.2f |" % (r["limit"], r.get("size", "-"),
                  r.get("streams", r.get("depth", "-")), r["gbps"]))
rtt = [r for r in R if r["mode"] == "limits" and "rtt_us" in r]
if rtt:
    md += ["", "Control plane round trip (3 KiB request, 128 B answer, loopback): " +
           "; ".join("%s %.1f us (%.1f us CPU)" % (r["limit"], r["rtt_us"], r["cpu_us"])
                     for r in rtt)]
ssd = [r for r in R if r["mode"] == "ssd"]
if ssd:
    md += ["", "## SSD tier (1 MiB objects, batches of 32, CRC on; limits measured in the same run)", "",
           "| op | GB/s | obj/s | p50 us | p99 us | limit | limit GB/s (before / after) | % of limit | target | met |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ssd:
        lim = "%.2f" % r["limit_gbps"]
        if "limit_before_gbps" in r:
            lim += " (%.2f / %.2f)" % (r["limit_before_gbps"], r["limit_after_gbps"])
        md.append("| %s | %.2f | %.0f | %.0f | %.0f | %s | %s | %.0f%% | %s | %s |" % (
            r["op"], r["gbps"], r["objs_per_s"], r["p50_us"], r["p99_us"], r["limit"],
            lim, r["pct_of_limit"],
            ("%.0f%%" % r["target_pct"]) if r["target_pct"] > 0 else "-", r["target_met"]))
    for r in ssd:
        if r["op"] == "offload":
            md += ["", "Offload: %d objects put, %.2f GB/s of puts in the steady part (%.2f GB/s over the "
                   "whole loop); %d offloaded, %d dropped, %d failed." % (
                       r["objects_put"], r["put_gbps"], r["put_gbps_all"], r["offloaded_objects"],
                       r["offload_dropped"], r["offload_failed"])]
        if r["op"] == "get_dram":
            ref = [d for d in R if d["mode"] == "data" and d["op"] == "get" and d["size"] == r["size"]
                   and d.get("loop", "none") == "none" and d["crc"] == "on" and d["transport"] == "shm"]
            if ref:
                md += ["", "get_dram %.2f GB/s through a segment with an SSD tier vs the data mode's shm "
                       "get of the same size %.2f GB/s." % (r["gbps"], ref[0]["gbps"])]
dfs = [r for r in R if r["mode"] == "dfs"]
if dfs:
    md += ["", "## DFS tier (1 MiB objects, batches of 32, CRC on; a local directory as the DFS)", "",
           "| op | client | objects | GB/s | obj/s | p50 batch us | p99 batch us |",
           "|---|---|---|---|---|---|---|"]
    for r in dfs:
        md.append("| %s | %s | %d | %.2f | %.0f | %.0f | %.0f |" % (
            r["op"], r["client"], r["objects"], r["gbps"], r["objs_per_s"], r["p50_batch_us"],
            r["p99_batch_us"]))
md += ["", "## meta", "", "| op | objects resident | keys/s | bytes/object |", "|---|---|---|---|"]
for r in R:
    if r["mode"] == "meta" and "keys_per_s" in r and r["run"] == "meta":
        md.append("| %s | %d | %.0f | %.0f |" % (r["op"], r["objects_resident"], r["keys_per_s"], r["bytes_per_object"]))
for r in R:
    if r["mode"] == "meta" and r.get("op") == "evict_cost" and r["run"] == "meta":
        md += ["", "Eviction cost: %.0f puts/s into a full pool of %d objects (every put evicts one) "
               "vs %.0f puts/s into the same pool at 90 %% (%d resident, no eviction): %.0f ns of eviction per put." % (
                   r["put_evicting_per_s"], r["objects_resident"], r["put_per_s"],
                   r["put_objects_resident"], r["evict_ns_per_put"])]
sec = [r for r in R if r["run"].startswith("sec_")]
if sec:
    def fig(kind, mode, rnd, pick):
        for r in sec:
            if r["run"] == "sec_%s_%s" % (kind, mode) and r["pair"] == rnd and pick(r):
                return r
        return None
    pts = [("tcp put, 4 KiB, batch 128 (obj/s)", "tcp4k", lambda r: r["op"] == "put", "objs_per_s"),
           ("tcp get, 4 KiB, batch 128 (obj/s)", "tcp4k", lambda r: r["op"] == "get", "objs_per_s"),
           ("tcp put, 4 KiB, TLS without grants (obj/s)", "tcp4k", lambda r: r["op"] == "put",
            "objs_per_s", "tlsnogrants"),
           ("tcp get, 4 KiB, TLS without grants (obj/s)", "tcp4k", lambda r: r["op"] == "get",
            "objs_per_s", "tlsnogrants"),
           ("shm put, 4 KiB, batch 128 (obj/s)", "shm4k", lambda r: r["op"] == "put", "objs_per_s"),
           ("shm get, 4 KiB, batch 128 (obj/s)", "shm4k", lambda r: r["op"] == "get", "objs_per_s"),
           ("tcp put, 1 MiB, batch 32 (GB/s)", "tcp1m", lambda r: r["op"] == "put", "gbps"),
           ("tcp get, 1 MiB, batch 32 (GB/s)", "tcp1m", lambda r: r["op"] == "get", "gbps"),
           ("master BatchExist, 1 M resident (keys/s)", "meta1m",
            lambda r: r.get("op") == "exist" and r.get("objects_resident") == 1000000, "keys_per_s"),
           ("master put, 1 M resident (keys/s)", "meta1m",
            lambda r: r.get("op") == "put" and r.get("objects_resident") == 1000000, "keys_per_s"),
           ("a connection: TCP (+ TLS 1.3 handshake) (us)", "meta1m",
            lambda r: r.get("op") == "connect", "connect_us")]
    def rounds_of(kind):
        return sorted({r["pair"] for r in sec if r["run"] == "sec_%s_plain" % kind})
    md += ["", "## TLS and an ACL on the control plane vs plain (pairs run back to back, the order flipped every pair)", "",
           "TLS/plain per pair; the target is checked on their median (one stalled run of the VM "
           "moves one pair, not the verdict).", "",
           "| point | plain per pair | TLS per pair | TLS/plain per pair | median | target | met |",
           "|---|---|---|---|---|---|---|"]
    for name, kind, pick, field, *tmode in pts:
        rounds = rounds_of(kind)
        p = [fig(kind, "plain", i, pick) for i in rounds]
        t = [fig(kind, tmode[0] if tmode else "tls", i, pick) for i in rounds]
        if None in p or None in t or not rounds:
            continue
        pv = [x[field] for x in p]
        tv = [x[field] for x in t]
        ratios = [b / a if a else 0 for a, b in zip(pv, tv)]
        med = sorted(ratios)[len(ratios) // 2] if len(ratios) % 2 else \
            sum(sorted(ratios)[len(ratios) // 2 - 1:len(ratios) // 2 + 1]) / 2
        is_cost = field == "connect_us"
        want = 0.97 if kind == "tcp1m" else 0.9
        fmt = "%.2f" if field == "gbps" else "%.0f"
        md.append("| %s | %s | %s | %s | %.2f | %s | %s |" % (
            name, " / ".join(fmt % v for v in pv), " / ".join(fmt % v for v in tv),
            " / ".join("%.2f" % v for v in ratios), med,
            "reported" if is_cost else ">= %gx" % want,
            "-" if is_cost else ("met" if med >= want else "**missed**")))
    # what TLS costs in CPU, which a busier or quieter machine does not move as much as a rate
    cpu = []
    for op, label in (("exist", "BatchExist"), ("put", "put (with its removes)"),
                      ("get_replica_list", "GetReplicaList")):
        row = []
        for mode in ("plain", "tls"):
            xs = [fig("meta1m", mode, i, lambda r, op=op: r.get("op") == op
                      and r.get("objects_resident") == 1000000) for i in rounds_of("meta1m")]
            xs = [x for x in xs if x is not None and x.get("master_cpu_us_per_1k_keys", -1) >= 0]
            mm = sorted(x["master_cpu_us_per_1k_keys"] for x in xs)
            cc = sorted(x["client_cpu_us_per_1k_keys"] for x in xs)
            row.append((mm[len(mm) // 2], cc[len(cc) // 2]) if mm else None)
        if None not in row:
            cpu.append("| %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |" % (
                label, row[0][0], row[1][0], row[1][0] / row[0][0] if row[0][0] else 0,
                row[0][1], row[1][1], row[1][1] / row[0][1] if row[0][1] else 0))
    if cpu:
        md += ["", "CPU per 1000 keys at 1 M resident (median of the runs; us): the master's, and the "
               "bench process's (its two client threads)", "",
               "| request | master plain | master TLS | TLS/plain | client plain | client TLS | TLS/plain |",
               "|---|---|---|---|---|---|---|"] + cpu
md += ["", "## alloc (per workload over its sizes; churn: per alloc+free pair)", "",
       "| workload | min utilisation | min utilisation, sizes >= 8 KiB | ns/alloc |", "|---|---|---|---|"]
wl = {}
for r in R:
    if r["mode"] == "alloc":
        u, u8, lo, hi = wl.get(r["workload"], (2.0, 2.0, float("inf"), 0.0))
        big = r["size"] >= 8192 or r["workload"] == "churn"
        wl[r["workload"]] = (min(u, r["utilisation"]), min(u8, r["utilisation"]) if big else u8,
                             min(lo, r["ns_per_alloc"]), max(hi, r["ns_per_alloc"]))
for k, (u, u8, lo, hi) in wl.items():
    md.append("| %s | %.4f | %.4f | %.0f-%.0f |" % (k, u, u8, lo, hi))
md += ["", "## trace (prefix hit rate: store eviction next to exact LRU and Belady of the same capacity)", "",
       "| trace | block | capacity | blocks | eviction | store | exact LRU | Belady | requests/s | errors |",
       "|---|---|---|---|---|---|---|---|---|---|"]
for r in R:
    if r["mode"] == "trace" and "hits_ssd" not in r and not r["run"].startswith(("class_", "pace")):
        errors = r["get_errors"] + r["put_errors"] + r["other_errors"]
        md.append("| %s | %d KiB | %g | %d | %s | %.4f | %.4f | %.4f | %.0f | %d |" % (
            r["trace"], r["block_bytes"] // 1024, r["capacity"], r["capacity_blocks"],
            r["eviction"], r["hit_rate"], r["lru_hit_rate"], r["belady_hit_rate"],
            r["requests_per_s"], errors))
# every workload class (and the FAST'25 trace, 4 KiB blocks) x capacity, unpaced
cls = [r for r in R if r["mode"] == "trace" and r.get("pace", 0) == 0 and r.get("clients", 1) == 1
       and (r["run"].startswith("class_") or r["run"] == "trace4k")]
if cls:
    md += ["", "## workload classes (store vs exact LRU vs Belady; gap closed = (store - LRU) / (Belady - LRU))", "",
           "| trace | capacity | blocks | store | exact LRU | Belady | gap closed | store >= LRU |",
           "|---|---|---|---|---|---|---|---|"]
    gaps = []
    for r in sorted(cls, key=lambda r: (r["trace"], r["capacity"])):
        d = r["belady_hit_rate"] - r["lru_hit_rate"]
        gap = (r["hit_rate"] - r["lru_hit_rate"]) / d if d >= 0.005 else None
        if gap is not None:
            gaps.append(gap)
        md.append("| %s | %g | %d | %.4f | %.4f | %.4f | %s | %s |" % (
            r["trace"], r["capacity"], r["capacity_blocks"], r["hit_rate"], r["lru_hit_rate"],
            r["belady_hit_rate"], "%.3f" % gap if gap is not None else "- (Belady - LRU < 0.005)",
            "yes" if r["hit_rate"] >= r["lru_hit_rate"] else
            "NO (%d blocks)" % round((r["lru_hit_rate"] - r["hit_rate"]) * r["blocks"])))
    if gaps:
        md.append("")
        md.append("Mean gap closed over the %d points where Belady is 0.005 or more above LRU: %.3f "
                  "(target 0.15)." % (len(gaps), sum(gaps) / len(gaps)))
pace = [r for r in R if r["mode"] == "trace" and r["run"].startswith("pace")]
if pace:
    md += ["", "## pace (10 % of each slice's unique blocks; the difference is to unpaced with one client)", "",
           "| trace | clients | pace | store | difference | exact LRU |", "|---|---|---|---|---|---|"]
    base = {r["trace"]: r["hit_rate"] for r in pace if r["pace"] == 0 and r["clients"] == 1}
    for r in sorted(pace, key=lambda r: (r["trace"], r["clients"], r["pace"])):
        md.append("| %s | %d | %s | %.4f | %+.4f | %.4f |" % (
            r["trace"], r["clients"], "unpaced" if r["pace"] == 0 else "x%g" % r["pace"],
            r["hit_rate"], r["hit_rate"] - base.get(r["trace"], r["hit_rate"]), r["lru_hit_rate"]))
tiers = [r for r in R if r["mode"] == "trace" and "hits_ssd" in r]
if tiers:
    md += ["", "## trace with tiers (hit rate over both tiers; share of the hits served by each)", "",
           "| block | DRAM capacity | SSD capacity | hit rate | from DRAM | from SSD | LRU (both) | Belady (both) | offloaded | promoted | dropped |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tiers:
        md.append("| %d KiB | %g | %g | %.4f | %.1f%% | %.1f%% | %.4f | %.4f | %d | %d | %d |" % (
            r["block_bytes"] // 1024, r["capacity"], r["ssd_capacity"], r["hit_rate"],
            100 * r["dram_hit_share"], 100 * r["ssd_hit_share"], r["lru_hit_rate"],
            r["belady_hit_rate"], r["offloaded_objects"], r["promoted_objects"], r["offload_dropped"]))
ha = [r for r in R if r["mode"] == "ha" and r["run"] == "ha"]
ha_tls = [r for r in R if r["mode"] == "ha" and r["run"] == "ha_tls" and r["part"] == "failover"]
if ha:
    md += ["", "## segment records and HA (kvpool-bench ha)", "",
           "| put | size | records on obj/s | off obj/s | on/off |", "|---|---|---|---|---|"]
    for r in ha:
        if r["part"] == "records":
            md.append("| %s | %d | %.0f | %.0f | %.3f |" % (r["transport"], r["size"],
                      r["objs_per_s_on"], r["objs_per_s_off"], r["ratio_on_off"]))
    for r in ha:
        if r["part"] == "rebuild":
            md += ["", "Rebuild: %d objects of %d B on %d segments, master killed (-9) and restarted: "
                   "segments back after %.0f ms, all %d adopted %.0f ms after the new master listened; "
                   "master RSS %.0f MiB before, %.0f MiB after; %d sampled keys %s." % (
                       r["objects"], r["size"], r["segments"], r["remount_ms"], r["adopted_objects"],
                       r["rebuild_ms"], r["rss_before_kib"] / 1024, r["rss_after_kib"] / 1024,
                       r["verified"], r["verify"])]
        if r["part"] == "failover" and not r.get("skipped"):
            md += ["", "Failover: %d kills of the leader (%d masters, --leader-ttl %d): first put "
                   "acknowledged after the kill in %.0f ms median (min %.0f, max %.0f); the client's "
                   "ops in the 3 s after a kill at %.2fx the 3 s before; lost objects %d, wrong bytes %d." % (
                       r["rounds"], r["masters"], r["leader_ttl"], r["failover_ms_median"],
                       r["failover_ms_min"], r["failover_ms_max"], r["ops_ratio"],
                       r["lost_objects"], r["wrong_bytes"])]
            for t in ha_tls:
                if not t.get("skipped"):
                    md += ["", "The same with TLS 1.3 and an ACL on every master and client: "
                           "%.0f ms median (min %.0f, max %.0f), %.2fx the plain median; ops after "
                           "a kill at %.2fx; lost objects %d, wrong bytes %d." % (
                               t["failover_ms_median"], t["failover_ms_min"], t["failover_ms_max"],
                               t["failover_ms_median"] / r["failover_ms_median"], t["ops_ratio"],
                               t["lost_objects"], t["wrong_bytes"])]
ix = {r["part"]: r for r in R if r["mode"] == "index"}
if ix:
    md += ["", "## kvpool-indexer (kvpool-bench index; each figure next to its limit)", "",
           "| figure | value | limit | met |", "|---|---|---|---|"]
    rows = [("in_process", "in process, block ops/s, decode included (one core)", "ops_per_s",
             "limit_ops_per_s", 1e6, "M", ">="),
            ("end_to_end", "end to end through ZeroMQ, block events/s", "events_per_s",
             "limit_events_per_s", 1e6, "M", ">="),
            ("query_latency", "POST /query, 8192 tokens, 64 instances, p99", "p99_us",
             "limit_p99_us", 1, "us", "<="),
            ("memory", "", "bytes_per_pair",
             "limit_bytes_per_pair", 1, "B", "<=")]
    mems = [r for r in R if r["mode"] == "index" and r["part"] == "memory"]
    for part, name, key, lim, scale, unit, op in rows:
        for r in (mems if part == "memory" else [ix[part]] if part in ix else []):
            if part == "memory":
                name = "bytes per (block, instance) pair, %d holder(s) per block" % (
                    r["holders_per_block"])
            md.append("| %s | %.2f %s | %s %g %s | %s |" % (name, r[key] / scale, unit, op,
                      r[lim] / scale, unit, r["limit_met"]))
    if "in_process" in ix:
        r = ix["in_process"]
        md += ["", "In process without the decode: %.2f M block ops/s; the naive baseline (a hash "
               "set per instance, scanned per query): %.2f M/s (%.1fx). %d requests, %d stored, "
               "%d removed and %d query blocks." % (
                   r["ops_per_s_apply_only"] / 1e6, r["baseline_ops_per_s"] / 1e6,
                   r["ratio_to_baseline"], r["requests"], r["stored_blocks"], r["removed_blocks"],
                   r["query_blocks"])]
tk = [r for r in R if r["mode"] == "tasks"]
if tk:
    md += ["", "## Copy and move tasks (kvpool-bench tasks)", "",
           "Rates from the first task started to the last ended; the wait for the owner's "
           "heartbeat (up to a second) apart.", "",
           "| transport | size | objects | put GB/s | copy GB/s | copy tasks/s | x put | "
           "move GB/s | x put | tcp pump GB/s | first started after (copy / move) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tk:
        md.append("| %s | %s | %d | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f | %s | %.0f / %.0f ms |" % (
            r["transport"], r["size"], r["objects"], r["put_gbps"], r["copy_gbps"],
            r["copy_tasks_per_s"], r["copy_ratio_to_put"], r["move_gbps"],
            r["move_ratio_to_put"], "%.2f" % r["tcp_pump_gbps"] if "tcp_pump_gbps" in r else "-",
            r["copy_start_ms"], r["move_start_ms"]))
te = [r for r in R if r["mode"] == "te"]
if te:
    met = sum(1 for r in te if r["target_met"] == "met")
    md += ["", "## Transfer engine (kvpool-bench te: batch_transfer_sync_write into a second "
           "process; limit measured next to each point: tcp the 2-stream socket pump over the "
           "batch's own bytes, shm a memcpy of them)", "",
           "| transport | run | batch | GB/s | p50 us | p99 us | limit | limit GB/s | % of limit | % per round | median | target | met | second figure: tcp the one-buffer pump (in cache), shm process_vm_writev alone, GB/s (% of it; median of the rounds) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in te:
        md.append("| %s | %d KiB | %d | %.2f | %.0f | %.0f | %s | %.2f | %.0f%% | %s | %.0f%% | >= %.0f%% | %s | %s |" % (
            r["transport"], r["size"] // 1024, r["batch"], r["gbps"], r["p50_us"], r["p99_us"],
            r["limit"], r["limit_gbps"], r["pct_of_limit"],
            " / ".join("%.0f" % r["pct_round_%d" % (i + 1)] for i in range(r["rounds"])),
            r["pct_median"], r["target_pct"], "met" if r["target_met"] == "met" else "**missed**",
            "%.2f (%.0f%%; %.0f%%)" % (r["one_buffer_gbps"], r["pct_of_one_buffer"],
                                       r["pct_one_buffer_median"])
            if r.get("one_buffer_gbps", 0) > 0 else
            "%.2f (%.0f%%; %.0f%%)" % (r["kernel_copy_gbps"], r["pct_of_kernel_copy"],
                                       r["pct_kernel_copy_median"])
            if r.get("kernel_copy_gbps", 0) > 0 else "-"))
    md += ["", "Targets met at %d of %d points." % (met, len(te))]
open(out_md, "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
echo "wrote $OUT/bench-results.json and $OUT/bench-results.md" >&2
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench.sh: FAILED runs: ${failed[*]} (their errors are above)" >&2
  exit 1
fi
