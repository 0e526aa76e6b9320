"""The test bed's checker (issue 27): reads the logs of tests/net/workload.py and names
every promise of docs/architecture.md ("Consistency") the calls broke.

- wrong bytes: a get returned bytes other than its key's value (keys are never
  overwritten here, so the only right answer is value(key), or an error);
- lost: a key whose put was acknowledged does not read back in the verify pass, and the
  scenario did not say it may be gone (lost_ok);
- missing: a get of a key whose put was acknowledged before the get began answered
  NOT_FOUND (not a timeout or a transport error: those are unavailability), unless the
  scenario said the key may be gone;
- half-visible: a failed put's key reads back with bytes other than its value (covered by
  wrong bytes: any get of it is checked).

Also measures the unavailability: the longest stretch of a run with no call succeeding,
for all calls and per op.
"""

import hashlib
import json

from workload import value

NOT_FOUND = -3  # kvpool.ERR_NOT_FOUND (the checker runs without the module)


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def longest_gap(calls, start, end):
    """The longest time in [start, end] with no successful call ending (seconds)."""
    t = sorted(c["t1"] for c in calls if c["ok"])
    edges = [start] + [x for x in t if start <= x <= end] + [end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def check(run_logs, verify_log, size, lost_ok=lambda key: False,
          missing_ok=lambda call: False):
    """(violations: [str], stats: dict). lost_ok(key): the scenario allows that key to be
    gone at the end; missing_ok(call): it allows that get to answer NOT_FOUND (a window
    in which the master does not list what a cut-off owner holds)."""
    runs = [c for p in run_logs for c in read(p)]
    ver = read(verify_log) if verify_log else []
    want = {}
    bad = []
    acked_at = {}
    for c in runs:
        if c["op"] == "put" and c["ok"]:
            acked_at.setdefault(c["key"], c["t1"])
    for c in runs + ver:
        if c["op"] != "get" or not c["ok"]:
            continue
        k = c["key"]
        if k not in want:
            want[k] = hashlib.sha256(value(k, size)).hexdigest()
        if c["sha256"] != want[k]:
            bad.append(f"wrong bytes: get {k} at {c['t0']:.3f} returned {c['len']} bytes "
                       f"that are not its value")
    for c in runs:
        if (c["op"] == "get" and not c["ok"] and c.get("code") == NOT_FOUND
                and c["key"] in acked_at and acked_at[c["key"]] < c["t0"]
                and not lost_ok(c["key"]) and not missing_ok(c)):
            bad.append(f"missing: get {c['key']} at {c['t0']:.3f} answered NOT_FOUND; its put "
                       f"was acknowledged at {acked_at[c['key']]:.3f}")
    got = {c["key"]: c for c in ver}
    for k in acked_at:
        c = got.get(k)
        if (c is None or not c["ok"]) and not lost_ok(k):
            why = "not asked" if c is None else f"{c.get('name')}: {c.get('err')}"
            bad.append(f"lost: the acknowledged put of {k} does not read back ({why})")
    stats = {"calls": len(runs), "failed": sum(1 for c in runs if not c["ok"]),
             "not_found": sum(1 for c in runs if not c["ok"] and c.get("code") == NOT_FOUND),
             "puts_acked": len(acked_at), "verified": sum(1 for c in ver if c["ok"])}
    if runs:
        start, end = min(c["t0"] for c in runs), max(c["t1"] for c in runs)
        stats["longest_gap_s"] = round(longest_gap(runs, start, end), 3)
        stats["longest_call_s"] = round(max(c["t1"] - c["t0"] for c in runs), 3)
        for op in ("put", "get"):
            stats[f"longest_{op}_gap_s"] = round(
                longest_gap([c for c in runs if c["op"] == op], start, end), 3)
    return bad, stats
