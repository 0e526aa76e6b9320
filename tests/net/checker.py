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

Registers (keys the workload upserts, one writer each, every attempt a new version;
docs/architecture.md, "Consistency"): a get of one returns
- bytes that are one version's value, of a version whose upsert began before the get ended
  (else wrong bytes);
- never an older version than one whose upsert was acknowledged before the get began
  (else stale);
- never an older version than one an earlier get (ended before this one began) returned:
  no upsert goes back in time for a reader that saw the new value (else back in time);
- NOT_FOUND only while an upsert of it is under way, or after one failed, or before the
  first acknowledged one (else missing); and the last acknowledged version, or a later
  attempted one, reads back in the verify pass (else lost).

Also measures the unavailability: the longest stretch of a run with no call succeeding,
for all calls and per op.
"""

import bisect
import hashlib
import json

from workload import is_register, reg_value, value

NOT_FOUND = -3  # kvpool.ERR_NOT_FOUND (the checker runs without the module)


def read(path):
    """The calls a log holds. A workload may still be writing it: a last line not yet
    ended by its newline is a call still being written, left for the next read. The file is
    read as one prefix and cut at its newlines: iterating its lines while it grows would hand
    a line written half before and half after a read as two pieces, the second one ended by
    the newline (a line starting mid-record; seen once in CI)."""
    with open(path) as f:
        text = f.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


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
    allruns = [c for p in run_logs for c in read(p)]
    allver = read(verify_log) if verify_log else []
    runs = [c for c in allruns if not is_register(c["key"])]
    ver = [c for c in allver if not is_register(c["key"])]
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
    regs = [c for c in allruns if is_register(c["key"])]
    bad += check_registers(regs, [c for c in allver if is_register(c["key"])], size, lost_ok,
                           missing_ok)
    runs = allruns
    stats = {"calls": len(runs), "failed": sum(1 for c in runs if not c["ok"]),
             "not_found": sum(1 for c in runs if not c["ok"] and c.get("code") == NOT_FOUND),
             "puts_acked": len(acked_at), "verified": sum(1 for c in allver if c["ok"]),
             "upserts_acked": sum(1 for c in regs if c["op"] == "upsert" and c["ok"]),
             "register_gets_ok": sum(1 for c in regs if c["op"] == "get" and c["ok"])}
    if runs:
        start, end = min(c["t0"] for c in runs), max(c["t1"] for c in runs)
        stats["longest_gap_s"] = round(longest_gap(runs, start, end), 3)
        stats["longest_call_s"] = round(max(c["t1"] - c["t0"] for c in runs), 3)
        for op in ("put", "get"):
            stats[f"longest_{op}_gap_s"] = round(
                longest_gap([c for c in runs if c["op"] == op], start, end), 3)
    return bad, stats


def running_max(items):
    """[(time, version, record)] sorted by time -> (times, the record of the highest version
    up to each)."""
    times, best, top = [], [], None
    for t, v, rec in sorted(items, key=lambda x: x[0]):
        if top is None or v > top["ver"]:
            top = rec
        times.append(t)
        best.append(top)
    return times, best


def highest_before(rm, t):
    """The record of the highest version whose time is before t (None: none)."""
    i = bisect.bisect_left(rm[0], t)
    return rm[1][i - 1] if i > 0 else None


def well_formed(g, began, want, size):
    """True: get g returned one version's value, of a version whose upsert began before g
    ended; else what it returned instead."""
    k, v = g["key"], g.get("ver")
    if v is not None and (k, v) not in want:
        want[(k, v)] = hashlib.sha256(reg_value(k, v, size)).hexdigest()
    if v is None or g["sha256"] != want[(k, v)]:
        return f"{g['len']} bytes that are no version's value"
    if v not in began or began[v] >= g["t1"]:
        return f"version {v}, whose upsert had not begun"
    return True


def check_registers(runs, ver, size, lost_ok, missing_ok):
    """The registers' promises (see the module's text); a list of what they broke."""
    bad = []
    want = {}
    for k in sorted({c["key"] for c in runs + ver}):
        ups = sorted((c for c in runs if c["key"] == k and c["op"] == "upsert"),
                     key=lambda c: c["t0"])
        gets = sorted((c for c in runs + ver if c["key"] == k and c["op"] == "get"),
                      key=lambda c: c["t0"])
        began = {u["ver"]: u["t0"] for u in ups}
        # the highest version acknowledged / returned by a time: (end time, running max)
        acks = running_max((u["t1"], u["ver"], u) for u in ups if u["ok"])
        seen = running_max((h["t1"], h["ver"], h) for h in gets
                           if h["ok"] and well_formed(h, began, want, size) is True)
        for g in gets:
            if not g["ok"]:
                if g.get("code") != NOT_FOUND or lost_ok(k) or missing_ok(g):
                    continue
                before = [u for u in ups if u["t0"] < g["t0"]]
                last = before[-1] if before else None
                newer = [u for u in ups if g["t0"] <= u["t0"] < g["t1"]]
                if last is not None and last["ok"] and last["t1"] < g["t0"] and not newer:
                    bad.append(f"missing: get {k} at {g['t0']:.3f} answered NOT_FOUND; its "
                               f"upsert of version {last['ver']} was acknowledged at "
                               f"{last['t1']:.3f} and none was under way")
                continue
            v = g.get("ver")
            why = well_formed(g, began, want, size)
            if why is not True:
                bad.append(f"wrong bytes: get {k} at {g['t0']:.3f} returned {why}")
                continue
            u = highest_before(acks, g["t0"])
            if u is not None and u["ver"] > v:
                bad.append(f"stale: get {k} at {g['t0']:.3f} returned version {v}; version "
                           f"{u['ver']} was acknowledged at {u['t1']:.3f}")
            h = highest_before(seen, g["t0"])
            if h is not None and h["ver"] > v:
                bad.append(f"back in time: get {k} at {g['t0']:.3f} returned version {v}; a "
                           f"get that ended at {h['t1']:.3f} had returned version {h['ver']}")
        acked = [u for u in ups if u["ok"]]
        if acked and not lost_ok(k):
            last = acked[-1]
            final = [g for g in ver if g["key"] == k]
            if not final or not final[-1]["ok"]:
                later = [u for u in ups if u["t0"] > last["t0"]]  # attempted after it
                if not later:
                    why = "not asked" if not final else \
                        f"{final[-1].get('name')}: {final[-1].get('err')}"
                    bad.append(f"lost: the acknowledged upsert of {k} (version {last['ver']}) "
                               f"does not read back ({why})")
    return bad
