"""Every public name of Mooncake's Python packages, provided by kvpool or documented.

tests/mooncake/mooncake_inventory.json lists the names Mooncake's `mooncake` package
exports at the commit kvpool follows (its pybind11 modules, its CPython extension, the
Python files it installs), with their parameters and, for classes, their methods and
properties. tests/mooncake/inventory.py generates it from Mooncake's source tree. No
network here, so this test cannot regenerate it: it only checks that the JSON was
written by the generator's current version. Moving to a newer Mooncake: regenerate it
from that tree (inventory.py's docstring says how), and what Mooncake added fails here.

Each name (a module, a module's name, a class's member) must be either
- provided by kvpool's `mooncake` package (imported, as tests/python/conftest.py does,
  from the kvpool on the path; a module of another `mooncake` directory that
  `mooncake/__init__.py`'s extended __path__ might find does not count) with a
  compatible signature: the calls Mooncake's parameters allow bind to kvpool's
  callable (inspect.signature: every name Mooncake takes by keyword is accepted, a
  positional argument lands on the parameter of the same name, one Mooncake makes
  optional is optional; *args / **kwargs may absorb them), a staticmethod stays one, a
  property is an attribute, a literal constant has Mooncake's value, a name bound to
  another is that same object; or
- listed in docs/python.md (or the file $KVPOOL_PYTHON_MD names), in the table
  `| name | why |` of the section `### What kvpool does not provide`, as its full dotted
  name in backticks (several in one cell may be comma-separated). A module listed
  covers its names and submodules, a class its members.
A method kvpool has only as a stub counts as not provided: a docstring starting "Not
supported by kvpool" (mooncake/store/__init__.py's _unsupported) or a body that only
raises NotImplementedError or calls the module's _unsupported() (mooncake/engine.py).
A listed name that kvpool now provides is a stale entry and fails too.

No master is needed: the modules are imported, nothing is called.
"""

import ast
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import textwrap
import types

import pytest

import kvpool
import mooncake

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, "tests", "mooncake", "mooncake_inventory.json")
GENERATOR = os.path.join(ROOT, "tests", "mooncake", "inventory.py")
PYTHON_MD = os.environ.get("KVPOOL_PYTHON_MD") or os.path.join(ROOT, "docs", "python.md")
HEADING = "### What kvpool does not provide"

P = inspect.Parameter

with open(INVENTORY, encoding="utf-8") as _f:
    INV = json.load(_f)
MODULES = INV["modules"]
COMMIT = INV["mooncake"]["commit"]

# kvpool's `mooncake` directory: the package next to kvpool's
KVPOOL_MOONCAKE = os.path.dirname(os.path.abspath(mooncake.__file__))


# ---------------------------------------------------------------------------------------
# docs/python.md's table
# ---------------------------------------------------------------------------------------

def not_provided_table(path=PYTHON_MD):
    """{full name: why} of the `| name | why |` table under HEADING, or None when the
    section is missing."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    in_code = False
    section = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.strip() == HEADING:
            section = i + 1
            break
    if section is None:
        return None
    table = {}
    in_code = False
    for line in lines[section:]:
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and re.match(r"^#{1,3} ", line):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] \
            if line.lstrip().startswith("|") else []
        if len(cells) < 2 or cells[0] == "name" or re.match(r"^:?-+:?$", cells[0]):
            continue
        why = "|".join(cells[1:]).strip()
        for name in re.findall(r"`([^`]+)`", cells[0]):
            table[name] = why
    return table


def covered(full, table):
    """The table's entry covering full (itself or a module / class above it), or None."""
    parts = full.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table:
            return ".".join(parts[:i])
    return None


# ---------------------------------------------------------------------------------------
# kvpool's side
# ---------------------------------------------------------------------------------------

def kvpool_module(modname):
    """kvpool's module modname, or None when kvpool's package has no such module (one
    that only another `mooncake` directory on the path has is not imported)."""
    rel = modname.split(".")[1:]
    if not all(p.isidentifier() for p in rel):
        return None  # mooncake.pg_<torch version>
    base = os.path.join(KVPOOL_MOONCAKE, *rel)
    files = [base + ".py", os.path.join(base, "__init__.py")] + \
        [base + s for s in importlib.machinery.EXTENSION_SUFFIXES]
    if rel and not any(os.path.isfile(f) for f in files):
        return None
    return importlib.import_module(modname)


def resolve(full):
    """kvpool's object for a full dotted name of the inventory, or None."""
    modname = max((m for m in MODULES if full == m or full.startswith(m + ".")), key=len,
                  default=None)
    if modname is None:
        return None
    obj = kvpool_module(modname)
    for part in full[len(modname):].split(".")[1:]:
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def is_stub(fn):
    """Whether fn is a method kvpool has only to refuse (module doc)."""
    fn = getattr(fn, "__func__", fn)
    if (inspect.getdoc(fn) or "").startswith("Not supported by kvpool"):
        return True
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(src).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return False
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = [s for s in node.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1:
        return False
    s = body[0]
    if isinstance(s, ast.Raise) and s.exc is not None:
        exc = s.exc.func if isinstance(s.exc, ast.Call) else s.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Name) and s.value.func.id == "_unsupported")


def instance_attributes(cls):
    """Names the instances of cls have that the class may not: dataclass fields,
    annotated attributes, and what the methods of cls and its kvpool bases assign as
    self.NAME."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for c in cls.__mro__:
        names.update(vars(c).get("__annotations__", {}))
        if not c.__module__.startswith(("mooncake", "kvpool")):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(c)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id == "self":
                    names.add(t.attr)
    return names


def static_member(cls, name):
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        return None


# ---------------------------------------------------------------------------------------
# signatures
# ---------------------------------------------------------------------------------------

def mooncake_params(params):
    """Mooncake's params list -> [(name, kind, optional)]."""
    slash = params.index("/") if "/" in params else -1
    kind = P.POSITIONAL_OR_KEYWORD
    out = []
    for i, p in enumerate(params):
        if p == "/":
            continue
        if p == "*":
            kind = P.KEYWORD_ONLY
        elif p.startswith("**"):
            out.append((p[2:], P.VAR_KEYWORD, True))
        elif p.startswith("*"):
            out.append((p[1:], P.VAR_POSITIONAL, True))
            kind = P.KEYWORD_ONLY
        else:
            name, eq, _ = p.partition("=")
            out.append((name, P.POSITIONAL_ONLY if i < slash else kind, bool(eq)))
    return out


def calls(params):
    """The calls Mooncake's parameters allow, as (description, args, kwargs, Mooncake
    names of the positional args): the required arguments only; everything by position
    that can go by position; everything by keyword that can go by keyword."""
    ps = mooncake_params(params)
    positional = [(n, k, o) for n, k, o in ps if k in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    kw_only = [(n, o) for n, k, o in ps if k == P.KEYWORD_ONLY]
    var_pos = any(k == P.VAR_POSITIONAL for _, k, _ in ps)
    var_kw = any(k == P.VAR_KEYWORD for _, k, _ in ps)
    out = []
    # required only (an optional argument before a required one goes by position too:
    # pybind11 allows `py::arg("key") = py::none(), py::arg("file_name")`)
    last = max((i for i, (_, _, o) in enumerate(positional) if not o), default=-1)
    pos = [(n, k) for n, k, _ in positional[:last + 1]]
    out.append(("required", pos, [n for n, o in kw_only if not o]))
    # all by position (two extra for *args), keyword-only ones and an extra for **kwargs
    pos = [(n, k) for n, k, _ in positional] + ([("*", None)] * 2 if var_pos else [])
    out.append(("positional", pos, [n for n, _ in kw_only] + (["**"] if var_kw else [])))
    # all by keyword
    pos = [(n, k) for n, k, _ in positional if k == P.POSITIONAL_ONLY]
    kws = [n for n, k, _ in positional if k == P.POSITIONAL_OR_KEYWORD] + [n for n, _ in kw_only]
    out.append(("keyword", pos, kws + (["**"] if var_kw else [])))
    return out


def describe(pos, kws):
    return "(" + ", ".join([n if n != "*" else "<extra>" for n, _ in pos]
                           + [f"{n}=" if n != "**" else "<extra>=" for n in kws]) + ")"


def signature_problems(sig, params, overloaded):
    """Why the calls Mooncake's params allow do not bind to sig (kvpool's, without
    self), or []."""
    problems = []
    for what, pos, kws in calls(params):
        args = [object() for _ in pos]
        kwargs = {("mooncake_extra_keyword" if n == "**" else n): object() for n in kws}
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            problems.append(f"rejects the call {describe(pos, kws)}: {e}")
            continue
        if overloaded:
            continue  # pybind11 picks an overload by type: one name per position is all
        landed = {}
        for name, value in bound.arguments.items():
            kind = sig.parameters[name].kind
            if kind == P.VAR_POSITIONAL:
                landed.update({id(v): "*" + name for v in value})
            elif kind == P.VAR_KEYWORD:
                landed.update({id(v): "**" + name for v in value.values()})
            else:
                landed[id(value)] = name
        for i, ((n, k), a) in enumerate(zip(pos, args)):
            got = landed.get(id(a))
            if k == P.POSITIONAL_OR_KEYWORD and got != n and not (got or "").startswith("*"):
                problems.append(f"takes Mooncake's positional argument {i + 1} `{n}` as `{got}`")
    return list(dict.fromkeys(problems))


def callable_problems(kv, entry, sig_of):
    """Problems of kvpool's callable kv for Mooncake's entry (params or overloads);
    sig_of() gives kv's signature without self (or raises ValueError/TypeError)."""
    if is_stub(kv):
        return ["is only a stub raising NotImplementedError"]
    if entry.get("async") and not inspect.iscoroutinefunction(kv):
        return ["is not a coroutine function (Mooncake's is async)"]
    overloads = entry.get("overloads") or [entry]
    if all(o.get("params") is None for o in overloads):
        return []
    try:
        sig = sig_of()
    except (ValueError, TypeError):
        return []  # no signature to read (a builtin): present is all that is known
    out = []
    for o in overloads:
        if o.get("params") is not None:
            out += signature_problems(sig, o["params"], len(overloads) > 1)
    return out


def drop_first(sig):
    ps = list(sig.parameters.values())
    if ps and ps[0].kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        ps = ps[1:]
    return sig.replace(parameters=ps)


# ---------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------

class Result:
    """What the check of one full name found: ok, or a problem (missing: not provided;
    else provided but incompatible)."""

    def __init__(self, full, problems=(), missing=False):
        self.full = full
        self.problems = list(problems)
        self.missing = missing

    @property
    def ok(self):
        return not self.problems and not self.missing


def check_member(cls, full, name, entry):
    raw = static_member(cls, name)
    kind = entry["kind"]
    if raw is None:
        if kind in ("property", "attr") and name in instance_attributes(cls):
            return Result(full)
        return Result(full, missing=True)
    if kind in ("property", "attr"):
        if callable(raw) and not isinstance(raw, (property, type)) and kind == "property":
            return Result(full, ["is a method in kvpool, a property in Mooncake"])
        if kind == "property" and not entry.get("readonly") and isinstance(raw, property) \
                and raw.fset is None:
            return Result(full, ["is read-only in kvpool, writable in Mooncake"])
        return Result(full)
    if kind == "class":
        return Result(full, [] if isinstance(raw, type) else ["is not a class"])
    # a method, staticmethod or classmethod (the constructor: __init__)
    if name == "__init__":
        return Result(full, callable_problems(raw, entry, lambda: inspect.signature(cls)))
    if isinstance(raw, property):
        return Result(full, [f"is a property in kvpool, a {kind} in Mooncake"])
    if kind in ("staticmethod", "classmethod") and not isinstance(raw, (staticmethod,
                                                                       classmethod)):
        return Result(full, [f"is not a staticmethod or classmethod (Mooncake's is a {kind})"])
    if isinstance(raw, staticmethod):
        fn, sig_of = raw.__func__, lambda: inspect.signature(raw.__func__)
    elif isinstance(raw, classmethod):
        fn, sig_of = raw.__func__, lambda: inspect.signature(getattr(cls, name))
    else:
        fn, sig_of = raw, lambda: drop_first(inspect.signature(raw))
    if not callable(fn):
        return Result(full, ["is not callable in kvpool"])
    problems = callable_problems(fn, entry, sig_of)
    missing = problems == ["is only a stub raising NotImplementedError"]
    return Result(full, [] if missing else problems, missing)


def check_name(km, modname, name, entry):
    """[Result] for a module's name and, for a class kvpool has, its members."""
    full = f"{modname}.{name}"
    if not hasattr(km, name):
        return [Result(full, missing=True)]
    obj = getattr(km, name)
    kind = entry["kind"]
    if "from" in entry:
        target = resolve(entry["from"])
        if target is not None and target is not obj and not (kind == "attr" and target == obj):
            return [Result(full, [f"is not kvpool's {entry['from']} (Mooncake binds it so)"])]
    if kind in ("class", "enum"):
        if not isinstance(obj, type):
            return [Result(full, [f"is not a class in kvpool ({type(obj).__name__})"])]
        problems = [f"has no member {v!r}" for v in entry.get("values", ())
                    if not hasattr(obj, v)]
        results = [Result(full, problems)]
        if "from" in entry:
            return results  # its members are checked under the name it is bound to
        for mname, mentry in entry.get("members", {}).items():
            results.append(check_member(obj, f"{full}.{mname}", mname, mentry))
        return results
    if kind == "function":
        if not callable(obj):
            return [Result(full, ["is not callable in kvpool"])]
        problems = callable_problems(obj, entry, lambda: inspect.signature(obj))
        if problems == ["is only a stub raising NotImplementedError"]:
            return [Result(full, missing=True)]
        return [Result(full, problems)]
    if kind == "module":
        return [Result(full, [] if isinstance(obj, types.ModuleType) else ["is not a module"])]
    if "value" in entry and obj != entry["value"]:
        return [Result(full, [f"is {obj!r} in kvpool, {entry['value']!r} in Mooncake"])]
    return [Result(full)]


def check_all():
    """[Result] for every module, name and member of the inventory (a module kvpool does
    not have: one Result, for the module)."""
    results = []
    for modname, mod in MODULES.items():
        km = kvpool_module(modname)
        if km is None:
            results.append(Result(modname, missing=True))
            continue
        results.append(Result(modname))
        for name, entry in mod["names"].items():
            results += check_name(km, modname, name, entry)
    return results


def known(full):
    """Whether full is a module, name or member of the inventory."""
    if full in MODULES:
        return True
    modname = max((m for m in MODULES if full.startswith(m + ".")), key=len, default=None)
    if modname is None:
        return False
    entry = {"members": MODULES[modname]["names"]}
    for part in full[len(modname) + 1:].split("."):
        entry = entry.get("members", {}).get(part)
        if entry is None:
            return False
    return True


# ---------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def table():
    t = not_provided_table()
    if t is None:
        pytest.fail(f"{PYTHON_MD} has no section `{HEADING}` (with its `| name | why |` "
                    "table of the Mooncake names kvpool does not provide)")
    return t


@pytest.fixture(scope="module")
def results():
    return check_all()


def test_kvpool_mooncake_package_is_kvpools():
    assert os.path.dirname(KVPOOL_MOONCAKE) == \
        os.path.dirname(os.path.dirname(os.path.abspath(kvpool.__file__))), \
        f"mooncake comes from {KVPOOL_MOONCAKE}, not from kvpool's package directory"


def test_inventory_is_current_generators():
    spec = importlib.util.spec_from_file_location("mooncake_inventory_generator", GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert INV["generator_version"] == gen.GENERATOR_VERSION, (
        f"{INVENTORY} was written by inventory.py version {INV['generator_version']}, the "
        f"generator is version {gen.GENERATOR_VERSION}: regenerate it from Mooncake's tree "
        f"at {COMMIT} (tests/mooncake/inventory.py --commit {COMMIT} TREE)")


def test_every_mooncake_name_is_provided_or_listed(results, table):
    bad = []
    for r in results:
        if r.ok or covered(r.full, table):
            continue
        if r.missing:
            bad.append(f"{r.full}: not in kvpool")
        else:
            bad.append(f"{r.full}: " + "; ".join(r.problems))
    assert not bad, (
        f"{len(bad)} of Mooncake's public names (at {COMMIT[:12]}) are neither provided by "
        f"kvpool's mooncake package with a compatible signature nor listed in "
        f"{os.path.relpath(PYTHON_MD, ROOT)} under `{HEADING}`:\n  " + "\n  ".join(bad))


def test_no_stale_rows(results, table):
    ok = {r.full for r in results if r.ok}
    bad = []
    for name in table:
        above = covered(name.rsplit(".", 1)[0], table) if "." in name else None
        if not known(name):
            bad.append(f"{name}: not a name of Mooncake's at {COMMIT[:12]}: remove it from the "
                       "table (or fix its spelling)")
        elif name in MODULES and kvpool_module(name) is not None:
            bad.append(f"{name}: kvpool has this module now: remove it from the table (and "
                       "list the names of it that kvpool lacks)")
        elif name in ok:
            bad.append(f"{name}: kvpool provides it now: remove it from the table")
        elif above:
            bad.append(f"{name}: the row of `{above}` covers it already: remove it from the "
                       "table")
    assert not bad, (f"stale rows in {os.path.relpath(PYTHON_MD, ROOT)} `{HEADING}`:\n  "
                     + "\n  ".join(bad))


def test_rows_say_why(table):
    bare = [name for name, why in table.items() if not why]
    assert not bare, f"rows of `{HEADING}` without a reason: {bare}"
