#!/usr/bin/env python3
"""The docs are a manual, not a journal.

    tests/check_docs.py [--root DIR]

Checks, over README.md, CHANGELOG.md, CONTRIBUTING.md, docs/*.md and docs/results/*.md:
- every relative Markdown link resolves: its file (or folder) exists, and its #anchor
  (GitHub's slug of a heading) is a heading of the file it names;
- README.md, CHANGELOG.md and docs/*.md name no commit hash (7 to 40 hex digits with a
  letter and a digit), no run name (main20, main27, ...) and no issue number (issue 46,
  issues 12 and 13, #48);
- docs/results/ holds at most 6 files, docs/benchmarks.md at most 600 lines, and
  CHANGELOG.md at most 200 lines a release (a release: a `## ` heading).
Prints each finding as `path:line: what`, exits 1 when there is any.
"""
import argparse
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
RUN = re.compile(r"\bmain[0-9]{1,3}\b")
ISSUE = re.compile(r"\b[Ii]ssues?\s+#?[0-9]+|(?<![\w&/])#[0-9]{1,4}\b")


def slug(heading):
    """GitHub's anchor of a heading's text."""
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link keeps its text
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(path, cache={}):
    if path not in cache:
        anchors = set()
        seen = {}
        fence = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fence = not fence
                    continue
                m = None if fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    a = slug(m.group(1))
                    n = seen.get(a, 0)
                    seen[a] = n + 1
                    anchors.add(a if n == 0 else f"{a}-{n}")
                for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                    anchors.add(m.group(1))
        cache[path] = anchors
    return cache[path]


def code_free(lines, inline):
    """The lines with fenced blocks (and inline code, when inline) blanked, line numbers
    kept."""
    out, fence = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fence = not fence
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`[^`]*`", "``", line) if inline else line)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    root = os.path.abspath(ap.parse_args().root)
    os.chdir(root)
    docs = sorted("docs/" + f for f in os.listdir("docs") if f.endswith(".md"))
    results = sorted("docs/results/" + f for f in os.listdir("docs/results") if f.endswith(".md"))
    files = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"] + docs + results
    no_journal = {"README.md", "CHANGELOG.md", *docs}
    bad = []
    for path in files:
        if not os.path.exists(path):
            bad.append(f"{path}: missing")
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        plain = code_free(lines, True)
        prose = code_free(lines, False)
        for no, line in enumerate(plain, 1):
            for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
                target = m.group(1)
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(dest):
                    bad.append(f"{path}:{no}: link to {target}: no such file")
                elif anchor and dest.endswith(".md") and anchor not in headings(dest):
                    bad.append(f"{path}:{no}: link to {target}: no such heading in {dest}")
            if path in no_journal:
                for rx, what in ((HASH, "a commit hash"), (RUN, "a run name"), (ISSUE, "an issue number")):
                    for m in rx.finditer(prose[no - 1]):
                        bad.append(f"{path}:{no}: {what}: {m.group(0)!r}")
    kept = [f for f in os.listdir("docs/results") if not f.startswith(".")]
    if len(kept) > 6:
        bad.append(f"docs/results: {len(kept)} files (at most 6)")
    with open("docs/benchmarks.md", encoding="utf-8") as f:
        n = sum(1 for _ in f)
    if n > 600:
        bad.append(f"docs/benchmarks.md: {n} lines (at most 600)")
    release, start = None, 0
    with open("CHANGELOG.md", encoding="utf-8") as f:
        cl = f.read().split("\n")
    for no, line in enumerate(cl + ["## end"], 1):
        if line.startswith("## "):
            if release is not None and no - start > 200:
                bad.append(f"CHANGELOG.md:{start}: release {release!r} is {no - start} lines (at most 200)")
            release, start = line[3:].strip(), no
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} findings")
        return 1
    print(f"{len(files)} files checked: links resolve, no journal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
