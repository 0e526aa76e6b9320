"""One side of a prefill -> decode KV transfer through mooncake.engine (test_transfer_engine.py).

Run as `python3 te_peer.py ROLE PROTOCOL [HOST]`; speaks JSON lines: one command on stdin,
one answer on stdout. Its KV cache is vLLM's host layout: one registered tensor per layer,
[2 (K/V), blocks, block bytes] uint8.
  decode: fills its cache with 0xEE, registers it, says {"port", "ptrs", "sizes"}; then
          {"op": "dump", "path"} saves the cache (np.save), {"op": "metrics"}.
  prefill: fills its cache from a seed (layer l: rng(seed + l)), says {"ready": true}; then
           {"op": "write"|"read", "target", "remote_ptrs", "pblocks", "dblocks"} moves the
           blocks pblocks[i] -> dblocks[i] of every layer and K/V as merged contiguous runs
           with batch_transfer_sync_write (or _read), answers {"rc", "status", "runs", "secs"};
           {"op": "raw", "target", "remote", "length", "write"} one range from its cache;
           {"op": "notify", "target", "remote", "name", "msg"} transfer_sync of one byte with
           a notify ("only": true, the notify without the transfer). Either: {"op": "notifies"} its get_notifies(),
           {"op": "regions", "target"} the target's first registered address (its REGIONS).
"""

import ctypes
import json
import os
import sys
import time

import numpy as np

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

LAYERS, BLOCKS, BLOCK_BYTES, SEED = 4, 64, 16384, 1234


def runs(pblocks, dblocks):
    """Merged contiguous runs: (p_start, d_start, count), both sides consecutive."""
    out = []
    for p, d in zip(pblocks, dblocks):
        if out and out[-1][0] + out[-1][2] == p and out[-1][1] + out[-1][2] == d:
            out[-1][2] += 1
        else:
            out.append([p, d, 1])
    return out


def main():
    if os.environ.get("TE_PEER_UNDUMPABLE"):  # PR_SET_DUMPABLE 0: others may not ptrace us
        assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    role, proto = sys.argv[1], sys.argv[2]
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", proto, "")
    if rc != 0:
        print(json.dumps({"error": te.last_status}), flush=True)
        return
    if role == "decode":
        caches = [np.full((2, BLOCKS, BLOCK_BYTES), 0xEE, np.uint8) for _ in range(LAYERS)]
    else:
        caches = [
            np.random.default_rng(SEED + l).integers(0, 256, (2, BLOCKS, BLOCK_BYTES), np.uint8)
            for l in range(LAYERS)
        ]
    ptrs = [c.ctypes.data for c in caches]
    sizes = [c.nbytes for c in caches]
    assert te.batch_register_memory(ptrs, sizes) == 0, te.last_status
    print(json.dumps({"port": te.get_rpc_port(), "ptrs": ptrs, "sizes": sizes}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "dump":
            np.save(cmd["path"], np.stack(caches))
            ans = {"ok": True}
        elif op == "metrics":
            ans = te.metrics()
        elif op in ("write", "read"):
            locs, rems, lens = [], [], []
            rr = runs(cmd["pblocks"], cmd["dblocks"])
            for l in range(LAYERS):
                for kv in range(2):
                    for p, d, n in rr:
                        locs.append(ptrs[l] + (kv * BLOCKS + p) * BLOCK_BYTES)
                        rems.append(cmd["remote_ptrs"][l] + (kv * BLOCKS + d) * BLOCK_BYTES)
                        lens.append(n * BLOCK_BYTES)
            t0 = time.monotonic()
            if op == "write":
                rc = te.batch_transfer_sync_write(cmd["target"], locs, rems, lens)
            else:
                rc = te.batch_transfer_sync_read(cmd["target"], locs, rems, lens)
            ans = {"rc": rc, "status": te.last_status, "runs": len(lens),
                   "secs": time.monotonic() - t0}
        elif op == "raw":
            t0 = time.monotonic()
            f = te.transfer_sync_write if cmd["write"] else te.transfer_sync_read
            rc = f(cmd["target"], ptrs[0], cmd["remote"], cmd["length"])
            ans = {"rc": rc, "status": te.last_status, "secs": time.monotonic() - t0}
        elif op == "notify":  # a one-byte write of its cache's first byte, with a notify
            nt = TransferNotify(cmd["name"], cmd["msg"])
            if cmd.get("only"):  # the notify alone, as a peer that skips the transfer could
                rc = te._notify(cmd["target"], nt)
            else:
                rc = te.transfer_sync(cmd["target"], ptrs[0], cmd["remote"], 1,
                                      TransferOpcode.WRITE, nt)
            ans = {"rc": rc, "status": te.last_status}
        elif op == "notifies":
            ans = {"notifies": [[n.name, n.msg] for n in te.get_notifies()]}
        elif op == "regions":  # what a peer learns of the target's memory (REGIONS)
            addr = te.get_first_buffer_address(cmd["target"])
            ans = {"addr": addr, "status": te.last_status}
        else:
            ans = {"error": "unknown op"}
        print(json.dumps(ans), flush=True)
    te.close()


if __name__ == "__main__":
    main()
