#!/usr/bin/env python3
"""Include layering of the tree: lower folders never include upward, no circles.

Each daemon's and the library's folders stand in layers, lowest first
(docs/architecture.md, "Where the code lives"). The client's:

    include/   the installed headers: include nothing of the library
    mem/       registered buffers, the GPU driver, thread buffers
    transfer/  the engine, its ops (xfer.h), peers, the transport interface
    transport/ tcp, shm, rdma (implement transfer/transport.h) and the tcp wire format
    segment/   this client's DRAM segment: its memory, data server, record
    control/   the session with the master, heartbeat, record sync, drain
    ssd/       the SSD segment (its own master connection, records, offloads)
    (top)      client/*.c|h: the public API (client.c, object.c, admin.c, ...)
    tools/ python/  programs on the public API (and the few internals they need)

The master's:

    match/     the key matcher: List's and RemoveByRegex's patterns, checked and bounded
               (key_pattern), and their Thompson NFA (key_nfa); knows no state
    meta/      data structures that know no state: objects, the segment table, the
               index, placement, leases, the ghost, tombstones, records, tenants, the
               copy and move tasks' table
    core/      the loop's state (state.[ch]), its settings (config.[ch]) and the
               event sink the state emits KV events through (event_sink.h)
    policy/    what stays and what goes: lists, leases, eviction, tiers, the copy and
               move tasks' life, the hot-key fanout
    auth/      who is calling: the ACL, credentials (TLS, ACL, tenants) and their
               reload, admission of each request, the audit log
    ha/        high availability: leadership (election glue), rebuild (adoption)
    rpc/       the request handlers, by concern, and what they share (call.c)
    obs/       what operators see: HTTP views, metrics, the KV events publisher;
               it reads a view the server fills, never the method table itself
    (top)      master/*.c|h: dispatch.c (the method table), server.c (the loop), main.c

A file may include a header of its own folder or of a lower one; anything else is
an upward include. Across the tree: common/ includes only common/ (and proto/);
master/, client/ and indexer/ (kvpool-indexer, a daemon of its own) include
their own folder, common/ and proto/, never each other; but client/tools/ (the
programs: kvpool-bench measures the indexer's index in process) may include
indexer/.

A circle is a set of modules (X.c with X.h) that include each other, directly or
through others (strongly connected components of the module graph).

    tests/check_layering.py [--root DIR] [--rev GIT_REV] [--dot]

Prints every violation and circle and a summary line; exits 1 if there is any.
--rev reads the tree of a git revision instead of the work tree (to compare
before and after); --dot prints the module graph (client, master, indexer) for
graphviz.
"""
import argparse
import os
import re
import subprocess
import sys

CLIENT_RANK = {
    "include": 0,
    "mem": 1,
    "transfer": 2,
    "transport": 3,
    "segment": 4,
    "control": 5,
    "ssd": 6,
    "": 7,  # client/*.c|h: the API level
    "tools": 8,
    "python": 8,
}
MASTER_RANK = {
    "match": 0,
    "meta": 1,
    "core": 2,
    "policy": 3,
    "auth": 4,
    "ha": 5,
    "rpc": 6,
    "obs": 7,
    "": 8,  # master/*.c|h: dispatch, server, main
}
# The ranked trees; indexer/ has no folders ranked yet (its circles are checked).
RANKS = {"client": CLIENT_RANK, "master": MASTER_RANK}
# What each top-level folder may include besides itself.
MAY_INCLUDE = {
    "common": {"proto"},
    "client": {"common", "proto"},
    "master": {"common", "proto"},
    "indexer": {"common", "proto"},
}
# Folders that may include more than their tree's MAY_INCLUDE: the programs.
MAY_INCLUDE_EXTRA = {("client", "tools"): {"indexer"}}
# Leaves of the module graph: programs on the API, never included back.
GRAPH_LEAVES = {("client", "tools"), ("client", "python")}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def list_files(root, rev):
    if rev:
        out = subprocess.run(["git", "-C", root, "ls-tree", "-r", "--name-only", rev],
                             check=True, capture_output=True, text=True).stdout
        names = out.split()
    else:
        names = []
        for d in MAY_INCLUDE:
            for dirpath, _, fnames in os.walk(os.path.join(root, d)):
                names += [os.path.relpath(os.path.join(dirpath, f), root) for f in fnames]
    return sorted(n for n in names if n.endswith((".c", ".h")))


def read(root, rev, name):
    if rev:
        return subprocess.run(["git", "-C", root, "show", f"{rev}:{name}"], check=True,
                              capture_output=True, text=True).stdout
    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
        return f.read()


def folder(path):
    """The folder of a path inside its top-level tree ('' for the tree's own files)."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def module(path):
    return os.path.splitext(path)[0]


def sccs(graph):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--rev")
    ap.add_argument("--dot", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = list_files(root, args.rev)
    present = set(files)

    upward, crossing = [], []
    graph = {}
    for f in files:
        top = f.split("/")[0]
        if top not in MAY_INCLUDE:
            continue
        for inc in INCLUDE_RE.findall(read(root, args.rev, f)):
            if inc not in present:
                continue  # generated (kvpool.pb-c.h) or system-like
            itop = inc.split("/")[0]
            if itop != top:
                if itop not in MAY_INCLUDE[top] and itop not in MAY_INCLUDE_EXTRA.get(
                        (top, folder(f)), ()):
                    crossing.append((f, inc))
                continue
            rank = RANKS.get(top)
            ff, fi = folder(f), folder(inc)
            if rank is not None:
                if ff not in rank or fi not in rank:
                    print(f"unknown {top} folder: {f} or {inc}")
                    return 2
                if fi != ff and rank[fi] >= rank[ff]:
                    upward.append((f, inc))
            if (top, ff) in GRAPH_LEAVES or module(f) == module(inc):
                continue
            graph.setdefault(module(f), set()).add(module(inc))
            graph.setdefault(module(inc), set())

    circles = sccs(graph)
    if args.dot:
        print("digraph layering {")
        for m in sorted(graph):
            for t in sorted(graph[m]):
                print(f'  "{m}" -> "{t}";')
        print("}")
    for f, inc in upward:
        print(f"upward include: {f} -> {inc}")
    for f, inc in crossing:
        print(f"include across top-level folders: {f} -> {inc}")
    for c in circles:
        print("circle: " + " <-> ".join(c))
    print(f"layering: {len(upward)} upward includes, {len(crossing)} across top-level folders, "
          f"{len(circles)} circles")
    return 1 if upward or crossing or circles else 0


if __name__ == "__main__":
    sys.exit(main())
