#!/usr/bin/env bash
# kvpool-bench limits with --tls-dir: the control plane's round trip plain (rtt), through
# TLS 1.3 with the library's own channel and server session (rtt-tls), and its TLS work
# alone over memory buffers (rtt-tls-mem), on certs
# made here (deploy/make-certs.sh) in a directory removed at the end. Fails when the mode
# fails or either row is missing or not positive, when the spliced pump's row
# (tcp-ws-splice, 1 MiB) is missing or empty, or when the machine block's idle
# settings differ from sysfs; never on speed. About 7 s.
#   tests/bench/rtt_tls.sh KVPOOL_BENCH SOURCE_ROOT OUT_DIR
set -euo pipefail
bench=$1 src=$2 out=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bash "$src/deploy/make-certs.sh" "$dir" admin >/dev/null
printf '[principal admin]\nroles = read, write, segment, admin\ncert-cn = admin\n' >"$dir/acl.conf"
"$bench" limits --sizes 4KiB,1MiB --duration 0.3 --tls-dir "$dir" --ssd-dir "$out" \
  --ssd-file-size 64MiB --quiet --json "$out/bench-smoke-rtt.json"
python3 - "$out/bench-smoke-rtt.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
# the machine block says how idle CPUs wait, as sysfs says it (docs/benchmarks.md, "Idle vCPUs")
def sysfs(path):
    try:
        return open(path).readline().strip()
    except OSError:
        return None
m = doc["machine"]
assert m["cpuidle_driver"] == (sysfs("/sys/devices/system/cpu/cpuidle/current_driver") or "none"), m
hp = sysfs("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
assert m["guest_halt_poll_ns"] == (int(hp) if hp else -1), m
# the spliced pump: for 1 MiB (256 KiB and up), 2 streams, a rate; none for 4 KiB
spl = [r for r in doc["results"] if r.get("limit") == "tcp-ws-splice"]
assert [(r["size"], r["streams"]) for r in spl] == [(1 << 20, 2)], spl
assert spl[0]["gbps"] > 0, spl
rows = {r["limit"]: r for r in doc["results"]
        if r.get("mode") == "limits" and "rtt_us" in r}
assert set(rows) == {"rtt", "rtt-tls", "rtt-tls-mem"}, rows
for name, r in rows.items():
    assert r["rtt_us"] > 0 and r["cpu_us"] > 0 and r["size"] == 3072, r
print("rtt %.1f us, rtt-tls %.1f us, rtt-tls-mem %.1f us" % tuple(
    rows[k]["rtt_us"] for k in ("rtt", "rtt-tls", "rtt-tls-mem")))
EOF
