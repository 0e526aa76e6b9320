#!/usr/bin/env python3
"""No C function in the tree is longer than --max lines (120 by default).

A function is a top-level brace block whose opening brace follows a parameter list
`)` (possibly with attributes or a newline between); its length counts from the line
of its opening brace to the line of its closing brace, both included. Comments, strings and character
constants are stripped before braces are counted, and preprocessor lines are skipped,
so a brace inside them counts for nothing. Struct, enum, union and initializer blocks
(`= {`) are not functions.

    tests/check_functions.py --root DIR [--max N] [PATH ...]

Scans common/ master/ client/ indexer/ (PATHs: other folders or files, relative to
--root). Prints one line per long function, `path:line: name is N lines (max M)`, and
exits 1 when there is any; prints the count of functions read and exits 0 otherwise.
"""
import argparse
import os
import re
import sys

DEFAULT_DIRS = ["common", "master", "client", "indexer"]


def strip(text):
    """The text with comments, strings and char constants blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, length) of every function in a C file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip(f.read())
    lines = text.split("\n")
    # blank preprocessor lines (with their continuations)
    cont = False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines[k] = ""
    depth = 0
    head = []  # code at depth 0 since the last ; or }
    start = None
    name = None
    found = []
    for k, line in enumerate(lines):
        for ch in line:
            if depth == 0 and ch not in "{}":
                head.append(ch)
                if ch == ";":
                    head = []
                continue
            if ch == "{":
                if depth == 0:
                    h = "".join(head)
                    flat = " ".join(h.split())
                    m = re.search(r"([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__\s*\(\(.*\)\)\s*)?$",
                                  flat)
                    is_fn = (m is not None and not re.search(r"=\s*$", flat)
                             and not re.search(r"\b(struct|enum|union)\s+\w*\s*$", flat)
                             and m.group(1) not in ("if", "for", "while", "switch", "sizeof"))
                    if is_fn:
                        name = m.group(1)
                        start = k  # the line of the opening brace
                    else:
                        name = None
                    head = []
                depth += 1
            elif ch == "}":
                depth = max(depth - 1, 0)
                if depth == 0:
                    if name is not None:
                        found.append((name, start + 1, k - start + 1))
                    name = None
                    head = []
        if depth == 0:
            head.append("\n")
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--max", type=int, default=120)
    ap.add_argument("paths", nargs="*")
    a = ap.parse_args()
    paths = a.paths or DEFAULT_DIRS
    files = []
    for p in paths:
        full = os.path.join(a.root, p)
        if os.path.isfile(full):
            files.append(full)
            continue
        for d, dirs, names in os.walk(full):
            dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")))
            files += [os.path.join(d, x) for x in sorted(names) if x.endswith((".c", ".h"))]
    long_ones = 0
    total = 0
    for f in files:
        for name, line, n in functions(f):
            total += 1
            if n > a.max:
                long_ones += 1
                print(f"{os.path.relpath(f, a.root)}:{line}: {name} is {n} lines (max {a.max})")
    if long_ones:
        print(f"{long_ones} of {total} functions are over {a.max} lines")
        return 1
    print(f"{total} functions read, none over {a.max} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
