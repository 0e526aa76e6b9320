#!/usr/bin/env python3
"""kvpool-bench data's breakdown of a batch's time (one thread): the master calls' wait and the
transfers' time per batch, and per method the op called, rpc_<method>_us (the mean wait of one
call) and rpc_<method>_calls_per_batch. Runs a --local tcp point with 1 and 4 threads and checks
what a reader of the JSON relies on: each op calls exactly its methods once per batch (a put:
PUT_COMMIT, its first batch a PutStart too; the
client's heartbeat, from another thread, may land in a few batches' windows), the
per-method waits add up to the op's master_rpc_us_per_batch, the calls and transfers fit in the
batch's mean time, and rows of several threads carry no breakdown (-1, no rpc_ fields).
Never checks a speed. About 5 s.

    tests/bench/breakdown.py KVPOOL_BENCH OUT_DIR
"""
import json
import subprocess
import sys

bench, out = sys.argv[1], sys.argv[2]
path = out + "/bench-smoke-breakdown.json"
subprocess.run([bench, "data", "--local", "--segment-size", "256MiB", "--transport", "tcp",
                "--sizes", "4KiB", "--batch", "16", "--threads", "1,4", "--duration", "0.3",
                "--quiet", "--json", path], check=True, stdout=subprocess.DEVNULL)
rows = [r for r in json.load(open(path))["results"] if r.get("mode") == "data"]
# a put batch makes one call, PUT_COMMIT, on room held ahead; the first batch of a run has
# none yet and places its own (PutStart) in a fraction of the batches
expect = {"put": {"put_commit"}, "get": {"get_replica_list", "lease_release"},
          "exist": {"exist"}}
sometimes = {"put": {"put_start", "heartbeat"}, "get": {"heartbeat"}, "exist": {"heartbeat"}}
seen = set()
for r in rows:
    rpc = {k[4:-3] for k in r if k.startswith("rpc_") and k.endswith("_us")}
    if r["threads"] != 1:
        assert r["master_rpc_us_per_batch"] == -1 and r["transfer_us_per_batch"] == -1, r
        assert not rpc, r
        continue
    op = r["op"]
    seen.add(op)
    # the client's own heartbeat (another thread) may land inside a batch's window: counted
    # as it is, in the few batches it meets
    assert expect[op] <= rpc <= expect[op] | sometimes[op], (op, rpc)
    total = 0.0
    for m in rpc:
        if m in expect[op]:
            assert r["rpc_%s_calls_per_batch" % m] == 1, (op, m, r)
        else:
            assert 0 < r["rpc_%s_calls_per_batch" % m] < 1, (op, m, r)
        assert r["rpc_%s_us" % m] > 0, (op, m, r)
        total += r["rpc_%s_us" % m] * r["rpc_%s_calls_per_batch" % m]
    assert abs(total - r["master_rpc_us_per_batch"]) <= 0.01 * total + 0.1, (total, r)
    mean_batch_us = r["batch"] / r["objs_per_s"] * 1e6
    assert r["master_rpc_us_per_batch"] + r["transfer_us_per_batch"] <= mean_batch_us * 1.01, r
    assert (r["transfer_us_per_batch"] > 0) == (op != "exist"), r
assert seen == set(expect), seen
print("breakdown: " + ", ".join(
    "%s %s" % (r["op"], " + ".join("%s %.1f us" % (m, r["rpc_%s_us" % m])
                                   for m in sorted(expect[r["op"]])))
    for r in rows if r["threads"] == 1))
