"""tests/net/checker.py against logs written by hand: each promise it names is named when a
log breaks it, and a log that keeps every promise (upserts failing, NOT_FOUND while one is
under way, a version read while its upsert was still running) breaks none. No hosts, no
root: the scenarios in test_net.py trust these verdicts."""

import hashlib
import json

import checker
from workload import reg_value, value

SIZE = 256
K = "w-reg-0"


def sha(b):
    return hashlib.sha256(b).hexdigest()


def up(v, t0, t1, ok=True):
    return {"op": "upsert", "key": K, "ver": v, "t0": t0, "t1": t1, "ok": ok}


def get(v, t0, t1, data=None):
    b = reg_value(K, v, SIZE) if data is None else data
    return {"op": "get", "key": K, "t0": t0, "t1": t1, "ok": True, "ver": v,
            "sha256": sha(b), "len": len(b)}


def miss(t0, t1):
    return {"op": "get", "key": K, "t0": t0, "t1": t1, "ok": False, "code": checker.NOT_FOUND,
            "name": "NOT_FOUND", "err": "not found"}


def verdict(tmp_path, run, ver=()):
    paths = []
    for name, recs in (("run", run), ("verify", ver)):
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        paths.append(str(p))
    bad, stats = checker.check([paths[0]], paths[1], SIZE)
    return bad


def test_an_honest_history_breaks_nothing(tmp_path):
    run = [miss(0.0, 0.1),                 # before the first upsert
           up(1, 1.0, 1.1), get(1, 1.2, 1.3),
           up(2, 2.0, 2.5, ok=False),      # failed: the key may be absent, or still 1
           get(1, 2.6, 2.7), miss(2.8, 2.9),
           up(3, 3.0, 3.4), get(3, 3.1, 3.2),  # read while its upsert ran
           miss(3.5, 3.6) | {"t0": 3.35},   # NOT_FOUND while upsert 3 was under way
           get(3, 3.7, 3.8),
           {"op": "put", "key": "w-0", "t0": 4.0, "t1": 4.1, "ok": True}]
    ver = [get(3, 9.0, 9.1),
           {"op": "get", "key": "w-0", "t0": 9.2, "t1": 9.3, "ok": True,
            "sha256": sha(value("w-0", SIZE)), "len": SIZE}]
    assert verdict(tmp_path, run, ver) == []


def test_a_stale_version_after_an_acknowledged_upsert(tmp_path):
    bad = verdict(tmp_path, [up(1, 1.0, 1.1), up(2, 2.0, 2.1), get(1, 2.2, 2.3)],
                  [get(2, 9.0, 9.1)])
    assert len(bad) == 1 and bad[0].startswith("stale: get w-reg-0 at 2.200 returned version 1")


def test_a_read_going_back_in_time(tmp_path):
    # upsert 2 never acknowledged (the reader saw it): a later read of 1 goes back
    bad = verdict(tmp_path, [up(1, 1.0, 1.1), up(2, 2.0, 3.0, ok=False), get(2, 2.1, 2.2),
                             get(1, 2.3, 2.4)], [get(2, 9.0, 9.1)])
    assert len(bad) == 1 and bad[0].startswith("back in time: get w-reg-0 at 2.300")


def test_bytes_of_no_version_and_a_version_never_begun(tmp_path):
    torn = bytearray(reg_value(K, 1, SIZE))
    torn[SIZE // 2:] = reg_value(K, 2, SIZE)[SIZE // 2:]
    bad = verdict(tmp_path, [up(1, 1.0, 1.1), up(2, 2.0, 2.1), get(1, 2.2, 2.3, bytes(torn)),
                             get(3, 2.4, 2.5)], [get(2, 9.0, 9.1)])
    assert len(bad) == 2
    assert bad[0].startswith("wrong bytes: get w-reg-0 at 2.200")
    assert "whose upsert had not begun" in bad[1]


def test_missing_and_lost(tmp_path):
    bad = verdict(tmp_path, [up(1, 1.0, 1.1), miss(1.2, 1.3)], [miss(9.0, 9.1)])
    assert len(bad) == 3
    assert bad[0].startswith("missing: get w-reg-0 at 1.200")
    assert bad[1].startswith("missing: get w-reg-0 at 9.000")
    assert bad[2].startswith("lost: the acknowledged upsert of w-reg-0 (version 1)")
    # a failed upsert after the last acknowledged one may leave the key absent
    assert verdict(tmp_path, [up(1, 1.0, 1.1), up(2, 2.0, 2.1, ok=False)],
                   [miss(9.0, 9.1)]) == []


def test_read_takes_whole_lines_of_a_log_being_written(tmp_path):
    """A workload appends its calls while the scenarios read them: a record not yet ended by
    its newline is left for the next read, never parsed in pieces."""
    p = tmp_path / "w.jsonl"
    recs = [get(v, v, v + 0.5) for v in range(3)]
    line = [json.dumps(r) + "\n" for r in recs]
    p.write_text(line[0] + line[1] + line[2][:40])  # the third one half written
    assert checker.read(str(p)) == recs[:2]
    with open(p, "a") as f:
        f.write(line[2][40:])
    assert checker.read(str(p)) == recs


def test_read_while_a_writer_appends(tmp_path):
    """Many reads while another thread appends records in small pieces: every read parses,
    and sees a growing prefix of what was written."""
    import threading

    p = tmp_path / "w.jsonl"
    p.write_text("")
    done = threading.Event()
    recs = [get(v % 7, v, v + 0.5) for v in range(2000)]

    def writer():
        with open(p, "a", buffering=1) as f:
            for r in recs:
                s = json.dumps(r) + "\n"
                f.write(s[:30])
                f.flush()
                f.write(s[30:])
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    seen = 0
    while not done.is_set():
        got = checker.read(str(p))
        assert got == recs[:len(got)] and len(got) >= seen
        seen = len(got)
    t.join()
    assert checker.read(str(p)) == recs
