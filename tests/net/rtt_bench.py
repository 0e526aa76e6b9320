"""The tcp path's speed at a real round-trip time (issue 27): a master, an owner and a client
each in a host of the net test bed (netbed.py); `kvpool-bench data` from the client host
(tcp, 4 KiB x 128 and 1 MiB x 32, get and put) next to a 2-stream socket pump from the
client host to the owner host, at each added RTT: none (the bare veth), then 0, 100 us and
1 ms through the bed's delaying proxy (netdelay: each way half the RTT; 0 shows what the
proxy's own copy costs). Prints one JSON line per point and a markdown table; with
--json FILE writes the lines there too.

Then a put's latency at a real round trip (docs/architecture.md "A put in one round trip"): at each
added RTT of --latency-rtts-us (100 us and 1 ms), 4 KiB x 32 put and get batches, the p50 of
a put with room held ahead (one master call: PUT_COMMIT) and without (KVPOOL_PUT_AHEAD=off:
PutStart and PutEnd), plain and with TLS 1.3 and data grants (its own master and owner,
certificates from deploy/make-certs.sh). The bound: a put's p50 at most 1.2 x one round
trip plus its transfer, which the get of the same batch measures in the same run (a get is
one master call, GetReplicaList, then the transfer; its lease goes back one-way).

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


def bench(host, bins, addr, size, batch, duration, tmp, env=None, tls_dir=None):
    out = os.path.join(tmp, f"b-{size}-{batch}.json")
    argv = [bins["bench"], "data", "--master", addr, "--transport", "tcp", "--sizes", size,
            "--batch", str(batch), "--duration", str(duration), "--json", out]
    if tls_dir:
        argv += ["--tls-dir", tls_dir]
    r = host.run(argv, timeout=600, env=env)
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


LAT_POINT = ("4KiB", 32)


def latency(bed, bins, tmp, rtts, duration, tls, log):
    """The put-latency part (module docstring): its own master and owner (TLS with tls);
    one line per (added RTT, mode)."""
    m, o, c = bed.hosts
    tls_dir = None
    margs, env_d = ["--auth", "none"], dict(os.environ)
    if tls:
        tls_dir = os.path.join(tmp, "tls")
        os.makedirs(tls_dir, exist_ok=True)
        subprocess.run(["deploy/make-certs.sh", tls_dir, "admin"], check=True,
                       capture_output=True, env=dict(os.environ, KVPOOL_SERVER_SAN=f"IP:{m.addr}"))
        with open(os.path.join(tls_dir, "acl.conf"), "w") as f:
            f.write("[principal admin]\nroles = read, write, segment, admin\ncert-cn = admin\n")
        margs = ["--tls-cert", f"{tls_dir}/server.crt", "--tls-key", f"{tls_dir}/server.key",
                 "--tls-ca", f"{tls_dir}/ca.crt", "--acl-file", f"{tls_dir}/acl.conf"]
        env_d.update(KVPOOL_TLS_CA=f"{tls_dir}/ca.crt", KVPOOL_TLS_CERT=f"{tls_dir}/admin.crt",
                     KVPOOL_TLS_KEY=f"{tls_dir}/admin.key")
    mp, addr = ready_start(bed, m, [bins["master"], "--listen", f"{m.addr}:0", "--ready-fd",
                                    "{fd}", *margs], log=log)
    op, _ = ready_start(bed, o, [bins["cli"], "--master", addr, "serve", "--segment-size",
                                 "1GiB", "--ready-fd", "{fd}", "--auth", "none"],
                        log=log, env=env_d)
    lines = []
    size, batch = LAT_POINT
    try:
        for rtt in rtts:
            bed.delay(c, rtt // 2, bins["netdelay"])
            for ahead in ("on", "off"):
                env = dict(os.environ)
                if ahead == "off":
                    env["KVPOOL_PUT_AHEAD"] = "off"
                r = bench(c, bins, addr, size, batch, duration, tmp, env=env, tls_dir=tls_dir)
                p, g = r["put"], r["get"]
                calls = {k: v for k, v in p.items() if k.endswith("_calls_per_batch")
                         and k.startswith("rpc_put")}
                line = {"part": "put_latency", "added_rtt_us": rtt, "tls": tls, "size": size,
                        "batch": batch, "put_ahead": ahead, "put_p50_us": p["p50_us"],
                        "get_p50_us": g["p50_us"], "put_gbps": p["gbps"],
                        "ratio_to_get": round(p["p50_us"] / g["p50_us"], 3),
                        "target_ratio": 1.2, "rpc_calls_per_put_batch": calls}
                line["target_met"] = ahead == "off" or line["ratio_to_get"] <= 1.2
                lines.append(line)
                print(json.dumps(line), flush=True)
    finally:
        bed.stop(op)
        bed.stop(mp)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--json")
    ap.add_argument("--duration", type=float, default=2)
    ap.add_argument("--rtts-us", default="0,100,1000")
    ap.add_argument("--latency-rtts-us", default="100,1000")
    ap.add_argument("--latency-only", action="store_true")
    ap.add_argument("--latency-tls", default="off,on", help="plain, TLS or both: off,on")
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
        settings = [] if a.latency_only else [None] + [int(x) for x in a.rtts_us.split(",")]
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
        lat = []
        for tls in [x == "on" for x in a.latency_tls.split(",")]:
            try:
                lat += latency(bed, bins, tmp, [int(x) for x in a.latency_rtts_us.split(",")],
                               a.duration, tls, log)
            except RuntimeError:
                log.flush()
                with open(os.path.join(tmp, "daemons.log"), errors="replace") as f:
                    sys.stderr.write(f.read()[-3000:])
                raise
        lines += lat
    if a.json:
        with open(a.json, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    print("\n| added RTT | control plane | put p50, one call (us) | put p50, two calls (us) | "
          "get p50: one round trip + transfer (us) | one call / get (target <= 1.2) |")
    print("|---|---|---|---|---|---|")
    for x in [y for y in lat if y["put_ahead"] == "on"]:
        two = [y for y in lat if y["put_ahead"] == "off" and y["tls"] == x["tls"]
               and y["added_rtt_us"] == x["added_rtt_us"]][0]
        print(f"| {x['added_rtt_us']} us | {'TLS 1.3 + grants' if x['tls'] else 'plain'} | "
              f"{x['put_p50_us']:.0f} | {two['put_p50_us']:.0f} | {x['get_p50_us']:.0f} | "
              f"{x['ratio_to_get']:.2f} |")
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
