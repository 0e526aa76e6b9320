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
    te/        the transfer engine (kvpool_te.h): a data server of registered memory
               and an initiator on the tcp transport, on the API level's helpers
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

--calls BUILD_DIR reads the calls as well, after the includes: the objects meson
built in BUILD_DIR for the product (client/, master/, indexer/, common/, proto/;
those of tests/ are left out), each mapped back to its source (compile_commands.json,
or the object's name), and their symbols (nm): module A uses module B when an object
of A references a function or datum that one of B defines. A symbol two product
objects define resolves to the user's own target, else its own top-level tree. The
same rules hold for these references as for includes (folder ranks, top-level
trees, circles); each is printed with a few of the symbols that make it.

    tests/check_layering.py [--root DIR] [--rev GIT_REV] [--dot] [--calls BUILD_DIR]

Prints every violation and circle and a summary line (with --calls a second one);
exits 1 if there is any. --rev reads the tree of a git revision instead of the work
tree (to compare before and after; --calls reads what BUILD_DIR holds); --dot prints
the module graph (client, master, indexer) for graphviz, with --calls the calls' too.
"""
import argparse
import json
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
    "te": 8,  # the transfer engine (kvpool_te.h): on the API level's helpers
    "tools": 9,
    "python": 9,
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
# The trees whose objects --calls reads (proto/: the generated kvpool.pb-c.c).
PRODUCT = set(MAY_INCLUDE) | {"proto"}
# nm's letters (nm -P) for a global the object defines, and for one it references.
NM_DEFINED = set("BCDGRSTVWiu")
NM_UNDEFINED = set("Uvw")
SYMBOLS_SHOWN = 4  # symbols printed per edge


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


class UnknownFolder(Exception):
    pass


def judge(f, g):
    """How the rules see file f using file g (an include or a reference): 'across',
    'upward' or None, and whether the edge joins the module graph."""
    top, gtop = f.split("/")[0], g.split("/")[0]
    if gtop != top:
        if gtop not in MAY_INCLUDE.get(top, ()) and gtop not in MAY_INCLUDE_EXTRA.get(
                (top, folder(f)), ()):
            return "across", False
        return None, False
    rank = RANKS.get(top)
    ff, fg = folder(f), folder(g)
    bad = None
    if rank is not None:
        if ff not in rank or fg not in rank:
            raise UnknownFolder(f"unknown {top} folder: {f} or {g}")
        if fg != ff and rank[fg] >= rank[ff]:
            bad = "upward"
    return bad, (top, ff) not in GRAPH_LEAVES and module(f) != module(g)


def check_includes(root, rev):
    """The include check: (upward, crossing, graph)."""
    files = list_files(root, rev)
    present = set(files)
    upward, crossing = [], []
    graph = {}
    for f in files:
        if f.split("/")[0] not in MAY_INCLUDE:
            continue
        for inc in INCLUDE_RE.findall(read(root, rev, f)):
            if inc not in present:
                continue  # generated (kvpool.pb-c.h) or system-like
            bad, joins = judge(f, inc)
            if bad == "across":
                crossing.append((f, inc))
            elif bad == "upward":
                upward.append((f, inc))
            if joins:
                graph.setdefault(module(f), set()).add(module(inc))
                graph.setdefault(module(inc), set())
    return upward, crossing, graph


def unflatten(base, d, name):
    """The file under base/d that meson flattened to name ('/' written '_')."""
    if os.path.isfile(os.path.join(base, d, name)):
        return os.path.join(d, name)
    for i, c in enumerate(name):
        if c == "_" and os.path.isdir(os.path.join(base, d, name[:i])):
            found = unflatten(base, os.path.join(d, name[:i]), name[i + 1:])
            if found:
                return found
    return None


def object_source(build, src, obj, commands):
    """The source of an object (a path relative to src, or to build if generated)."""
    path = commands.get(obj)
    if path:
        for base in (build, src):  # build first: it may lie inside src
            if path.startswith(base + os.sep):
                return os.path.relpath(path, base)
        return None
    # meson's name: the source's path from the target's folder, '/' written '_'
    # (client/libkvpool_static.a.p/transfer_engine.c.o, ...p/.._src_te.c.o); a
    # generated source's from the target's private folder (meson-generated_.._x.c.o).
    pdir = os.path.dirname(obj)
    name = os.path.basename(obj)[:-len(".o")]
    base, d = src, os.path.dirname(pdir)
    if name.startswith("meson-generated_"):
        base, d, name = build, pdir, name[len("meson-generated_"):]
    while name.startswith(".._"):
        d, name = os.path.dirname(d), name[len(".._"):]
    return unflatten(base, d, name)


def build_objects(build, src):
    """The product's objects in build: {object (relative to build): its source}."""
    commands = {}
    try:
        with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
            for c in json.load(f):
                if c.get("output"):
                    out = os.path.normpath(os.path.join(c["directory"], c["output"]))
                    commands[os.path.relpath(out, build)] = os.path.normpath(
                        os.path.join(c["directory"], c["file"]))
    except (OSError, ValueError):
        pass  # decode the names
    objects = {}
    for dirpath, _, fnames in os.walk(build):
        for fname in fnames:
            if not fname.endswith(".o"):
                continue
            obj = os.path.relpath(os.path.join(dirpath, fname), build)
            if obj.split(os.sep)[0] not in PRODUCT:
                continue  # tests/: its programs, fixtures, fuzzers
            source = object_source(build, src, obj, commands)
            if source and source.split(os.sep)[0] in PRODUCT:
                objects[obj] = source.replace(os.sep, "/")
    return objects


def read_symbols(build, objects):
    """nm over the objects: {object: (defined, referenced)}, globals only."""
    syms = {o: (set(), set()) for o in objects}
    names = sorted(objects)
    for i in range(0, len(names), 400):
        out = subprocess.run(["nm", "-P", "-A"] + names[i:i + 400], cwd=build, check=True,
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            obj, _, rest = line.rpartition(": ")
            fields = rest.split()
            if obj not in syms or len(fields) < 2:
                continue
            if fields[1] in NM_DEFINED:
                syms[obj][0].add(fields[0])
            elif fields[1] in NM_UNDEFINED:
                syms[obj][1].add(fields[0])
    return syms


def resolve(owners, user, target):
    """The modules a reference from user (in target) binds to, of the files defining it:
    the user's own target's, else its top-level tree's, else all of them."""
    if any(module(f) == module(user) for f, _ in owners):
        return []  # its own module's, built twice
    for near in ([f for f, t in owners if t == target],
                 [f for f, _ in owners if f.split("/")[0] == user.split("/")[0]]):
        if near:
            return sorted(set(near))
    return sorted({f for f, _ in owners})


def check_calls(build, src):
    """The call check: (upward, crossing, graph, edges, objects); edges maps
    (file, file) and (module, module) to the symbols that make them."""
    objects = build_objects(build, src)
    syms = read_symbols(build, objects)
    owners = {}
    for obj, (defined, _) in syms.items():
        for s in defined:
            owners.setdefault(s, []).append((objects[obj], os.path.dirname(obj)))
    uses = {}
    for obj, (_, referenced) in syms.items():
        f = objects[obj]
        for s in referenced:
            for g in resolve(owners.get(s, ()), f, os.path.dirname(obj)):
                uses.setdefault((f, g), set()).add(s)
    upward, crossing = [], []
    graph, edges = {}, {}
    for (f, g), used in sorted(uses.items()):
        bad, joins = judge(f, g)
        edges[(f, g)] = used
        if bad == "across":
            crossing.append((f, g))
        elif bad == "upward":
            upward.append((f, g))
        if joins:
            graph.setdefault(module(f), set()).add(module(g))
            graph.setdefault(module(g), set())
            edges.setdefault((module(f), module(g)), set()).update(used)
    return upward, crossing, graph, edges, objects


def shown(symbols):
    names = sorted(symbols)
    more = f", +{len(names) - SYMBOLS_SHOWN} more" if len(names) > SYMBOLS_SHOWN else ""
    return ", ".join(names[:SYMBOLS_SHOWN]) + more


def print_dot(name, graph):
    print(f"digraph {name} {{")
    for m in sorted(graph):
        for t in sorted(graph[m]):
            print(f'  "{m}" -> "{t}";')
    print("}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--rev")
    ap.add_argument("--dot", action="store_true")
    ap.add_argument("--calls", metavar="BUILD_DIR")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    try:
        upward, crossing, graph = check_includes(root, args.rev)
        if args.calls:
            build = os.path.abspath(args.calls)
            src = root
            try:  # the sources meson built from, where they are not --root
                with open(os.path.join(build, "meson-info", "meson-info.json"),
                          encoding="utf-8") as f:
                    src = os.path.abspath(json.load(f)["directories"]["source"])
            except (OSError, ValueError, KeyError):
                pass
            try:
                cup, ccross, cgraph, edges, objects = check_calls(build, src)
            except (OSError, subprocess.CalledProcessError) as e:  # no nm, or it failed
                print(f"calls: nm: {getattr(e, 'stderr', None) or e}".rstrip())
                return 2
    except UnknownFolder as e:
        print(e)
        return 2

    circles = sccs(graph)
    if args.dot:
        print_dot("layering", graph)
    for f, inc in upward:
        print(f"upward include: {f} -> {inc}")
    for f, inc in crossing:
        print(f"include across top-level folders: {f} -> {inc}")
    for c in circles:
        print("circle: " + " <-> ".join(c))
    print(f"layering: {len(upward)} upward includes, {len(crossing)} across top-level folders, "
          f"{len(circles)} circles")
    failed = upward or crossing or circles
    if not args.calls:
        return 1 if failed else 0

    if not objects:
        print(f"calls: no product objects in {build} (build it first)")
        return 2
    ccircles = sccs(cgraph)
    if args.dot:
        print_dot("calls", cgraph)
    for f, g in cup:
        print(f"upward reference: {f} -> {g} ({shown(edges[(f, g)])})")
    for f, g in ccross:
        print(f"reference across top-level folders: {f} -> {g} ({shown(edges[(f, g)])})")
    for c in ccircles:
        print("call circle: " + " <-> ".join(c))
        for m in c:
            for t in sorted(cgraph[m] & set(c)):
                print(f"  {m} -> {t}: {shown(edges[(m, t)])}")
    print(f"calls: {len(cup)} upward references, {len(ccross)} across top-level folders, "
          f"{len(ccircles)} circles ({len(objects)} objects)")
    return 1 if failed or cup or ccross or ccircles else 0


if __name__ == "__main__":
    sys.exit(main())
