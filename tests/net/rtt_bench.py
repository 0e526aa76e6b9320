"""The tcp path's speed at a real round-trip time (issue 27): a master, an owner and a client
each in a host of the net test bed (netbed.py); `kvpool-bench data` from the client host
(tcp, 4 KiB x 128 and 1 MiB x 32, get and put) next to a 2-stream socket pump from the
client host to the owner host, at each added RTT: none (the bare veth), then 0, 100 us and
1 ms through the bed's delaying proxy (netdelay: each way half the RTT; 0 shows what the
proxy's own copy costs). Prints one JSON line per point and a markdown table; with
--json FILE writes the lines there too.

Run as root from the repository root after a build (deploy/net-rtt-bench.sh does):
    python3 tests/net/rtt_bench.py --build build [--json rtt.jsonl] [--duration 2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netbed  # noqa: E402
from test_net import ready_start  # noqa: E402

POINTS = [("4KiB", 128), ("1MiB", 32)]


def bench(host, bins, addr, size, batch, duration, tmp):
    out = os.path.join(tmp, f"b-{size}-{batch}.json")
    r = host.run([bins["bench"], "data", "--master", addr, "--transport", "tcp", "--sizes",
                  size, "--batch", str(batch), "--duration", str(duration), "--json", out],
                 timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"kvpool-bench failed: {r.stderr[-2000:]}")
    with open(out) as f:
        res = json.load(f)["results"]
    return {x["op"]: x for x in res if x.get("op") in ("put", "get")}


def pump(host, bins, sink_addr, sink_port, seconds):
    r = host.run([bins["netdelay"], "pump", sink_addr, str(sink_port), "2", str(seconds)],
                 timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"pump failed: {r.stderr}")
    return json.loads(r.stdout)["gbps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--json")
    ap.add_argument("--duration", type=float, default=2)
    ap.add_argument("--rtts-us", default="0,100,1000")
    a = ap.parse_args()
    b = os.path.abspath(a.build)
    bins = {"master": f"{b}/master/kvpool-master", "cli": f"{b}/client/kvpool",
            "bench": f"{b}/client/kvpool-bench", "netdelay": f"{b}/tests/netdelay"}
    lines = []
    with netbed.NetBed(3) as bed, tempfile.TemporaryDirectory() as tmp:
        m, o, c = bed.hosts
        log = open(os.path.join(tmp, "daemons.log"), "ab")
        _, addr = ready_start(bed, m, [bins["master"], "--listen", f"{m.addr}:0", "--ready-fd",
                                       "{fd}", "--auth", "none"], log=log)
        ready_start(bed, o, [bins["cli"], "--master", addr, "serve", "--segment-size", "1GiB",
                             "--auth", "none", "--ready-fd", "{fd}"], log=log)
        sink = bed.start(o, [bins["netdelay"], "sink", "0"], stdout=subprocess.PIPE, text=True)
        sink_port = int(sink.stdout.readline())
        settings = [None] + [int(x) for x in a.rtts_us.split(",")]
        for rtt in settings:
            if rtt is not None:
                bed.delay(c, rtt // 2, bins["netdelay"])
            gbps = pump(c, bins, o.addr, sink_port, 3)
            for size, batch in POINTS:
                r = bench(c, bins, addr, size, batch, a.duration, tmp)
                for op in ("get", "put"):
                    line = {"added_rtt_us": rtt, "proxy": rtt is not None, "size": size,
                            "batch": batch, "op": op, "gbps": r[op]["gbps"],
                            "p50_us": r[op]["p50_us"], "pump_gbps": round(gbps, 3),
                            "pct_of_pump": round(100 * r[op]["gbps"] / gbps, 1)}
                    lines.append(line)
                    print(json.dumps(line), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    print("\n| added RTT | object x batch | get GB/s (p50 us) | put GB/s (p50 us) | "
          "2-stream pump GB/s | get / put % of pump |")
    print("|---|---|---|---|---|---|")
    for rtt in settings:
        for size, batch in POINTS:
            g, p = [x for x in lines if x["added_rtt_us"] == rtt and x["size"] == size
                    and x["batch"] == batch]
            name = "none (no proxy)" if rtt is None else f"{rtt} us (proxy)"
            print(f"| {name} | {size} x {batch} | {g['gbps']:.3f} ({g['p50_us']:.0f}) | "
                  f"{p['gbps']:.3f} ({p['p50_us']:.0f}) | {g['pump_gbps']:.2f} | "
                  f"{g['pct_of_pump']:.0f} / {p['pct_of_pump']:.0f} |")


if __name__ == "__main__":
    main()
