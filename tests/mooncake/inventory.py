#!/usr/bin/env python3
"""The public names of Mooncake's Python packages, read from Mooncake's source tree.

    tests/mooncake/inventory.py [--commit SHA] TREE > tests/mooncake/mooncake_inventory.json

TREE is a checkout of kvcache-ai/Mooncake, or an export of one (then pass the
commit with --commit; a checkout's HEAD is read with git). From a bare clone (a
snapshot may lack the large binary files, which only the C/C++/Python sources matter
beside: leave them out of the archive):

    mkdir /tmp/mc && git -C MIRROR archive SHA -- . ':!FAST25-release' ':!*.gif' |
        tar -x -C /tmp/mc
    tests/mooncake/inventory.py --commit SHA /tmp/mc > tests/mooncake/mooncake_inventory.json

tests/python/test_mooncake_inventory.py checks every name of the output against
kvpool's `mooncake` package and docs/python.md ("What kvpool does not provide").
Moving to a newer Mooncake: regenerate from its tree, and the names it added fail that
test until kvpool provides them or the table lists them.

What is read (nothing is imported or built, only the standard library is used):
- the pybind11 modules: every PYBIND11_MODULE of the tree (mooncake-integration's
  `store` and `engine`, mooncake-ep's `_ep`, mooncake-pg's torch extension) with the
  bind_*(m) helpers it calls, by a small C++ scanner (comments and strings skipped,
  #if/#ifdef tracked, brackets matched);
- the CPython extension mooncake/_fast_copy.c (its PyMethodDef tables);
- with `ast`, every Python file Mooncake installs into the `mooncake` package:
  mooncake-wheel/mooncake/*.py, the mooncake-integration/*.py files its CMake installs,
  and mooncake-reshard/python/mooncake/reshard (python/CMakeLists.txt).

Output: {"generator_version": N, "mooncake": {"repository", "commit"},
"modules": {"mooncake.store": {"source": [...], "kind": "pybind11" | "python" |
"c-extension", "names": {NAME: ENTRY}, ...}}}, names in source order. An ENTRY:

  kind      class | function | attr | enum | module
  params    the parameters as Python writes them: "name", "name=default", "*args",
            "**kwargs", "*" (keyword-only after it), "/" (positional-only before it);
            null when unknown. A pybind11 def without py::arg takes its arguments only
            by position: its C++ parameter names are listed, then "/". Defaults are the
            source's text (C++ `py::none()`, `nullptr`, `true`, `false` written as Python).
  overloads a pybind11 name def'd more than once: one {"params": ...} per overload
  members    a class's methods, properties and attributes: {NAME: {"kind": "method" |
            "staticmethod" | "classmethod" | "property" | "attr" | "class", "params",
            "readonly" (properties), ...}}; "__init__" is the constructor (absent for a
            pybind11 class that Python cannot construct)
  values    an enum's members
  from      the full name this one is bound to (an import from another mooncake module,
            `X = Y`, pybind11's `m.attr("X") = m.attr("Y")`); kind is then Y's
  value     a Python attribute's literal value (an `expr` when not a literal)
  async     a coroutine function
  cond      the preprocessor condition a pybind11 def is compiled under (e.g. USE_CUDA)
  guard     the Python block a name is bound in ("try", "except ImportError", "if ...")
  private   a `_name` kept because other Mooncake code uses it (`used_by`: where);
            the module's other `_names` are in its `private_omitted`

Module-level `export_values()` members of a pybind11 enum are names of the module too
(kind attr, `from` the enum member). "not_in_package" names the PYBIND11_MODULEs of the
tree that are not `mooncake` modules, and why.
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys

# Raise when the output changes for the same tree (a new field, a fix in the scanner):
# the test compares it with the JSON's and asks for a regeneration.
GENERATOR_VERSION = 1

REPOSITORY = "https://github.com/kvcache-ai/Mooncake"

# PYBIND11_MODULE name -> the module Python imports it as
PYBIND_MODULE_PATHS = {
    "store": "mooncake.store",
    "engine": "mooncake.engine",
    "_ep": "mooncake._ep",
    # built once per torch version: mooncake.pg_2_8_0, ...; mooncake/pg.py and ep.py load it
    "TORCH_EXTENSION_NAME": "mooncake.pg_<torch version>",
}
# PYBIND11_MODULEs that are not part of the `mooncake` package (source dir prefix: why)
PYBIND_NOT_IN_PACKAGE = {
    "mooncake-transfer-engine/tent/": "TENT's own top-level `tent` module (package tent-core)",
}
# mooncake-integration's Python files that its CMakeLists.txt installs into the package
INTEGRATION_PY = ("store/async_store.py", "shared_segment.py", "allocator.py",
                  "allocator_ascend_npu.py", "fabric_allocator_utils.py")
C_EXTENSIONS = {"mooncake-wheel/mooncake/_fast_copy.c": "mooncake._fast_copy"}

SKIP_DIRS = {".git", "build", "third_party", "extern", "__pycache__"}


# ---------------------------------------------------------------------------------------
# C++ text
# ---------------------------------------------------------------------------------------

OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = {")", "]", "}"}


def skip_string(s, i):
    """s[i] is a quote: the index after its closing quote (an apostrophe with no closing
    one on its line, a digit separator, is one character)."""
    q = s[i]
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == q:
            return j + 1
        if s[j] == "\n" and q == "'":
            return i + 1
        j += 1
    return len(s)


def is_quote(s, j):
    """Whether s[j] opens a string or character literal (not 1'000 or u8'x')."""
    return s[j] == '"' or (s[j] == "'" and not (j > 0 and s[j - 1].isalnum()))


def strip_comments(src):
    """src with // and /* */ comments blanked (offsets and newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith('R"', i) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', src[i:])
            end = i + 1
            if m:
                end = src.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
            out.append(src[i:end])
            i = end
        elif c in "\"'":
            j = skip_string(src, i)
            out.append(src[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def preprocess(src):
    """(text, conds): src with comments and preprocessor lines blanked (offsets kept), and
    the #if conditions in force as [(offset, condition or None)], sorted by offset."""
    text = strip_comments(src)
    stack = []
    conds = [(0, None)]
    out = []
    off = 0
    continued = False
    for line in text.split("\n"):
        s = line.strip()
        if continued or s.startswith("#"):
            directive = not continued
            continued = s.endswith("\\")
            d = re.match(r"#\s*(\w+)\s*(.*?)\\?$", s) if directive else None
            if d:
                kw, arg = d.group(1), d.group(2).strip()
                if kw == "ifdef":
                    stack.append(arg)
                elif kw == "ifndef":
                    stack.append("!" + arg)
                elif kw == "if":
                    stack.append(arg)
                elif kw == "elif" and stack:
                    stack[-1] = arg
                elif kw == "else" and stack:
                    top = stack[-1]
                    stack[-1] = top[1:] if re.match(r"^!\w+$", top) else "!(" + top + ")"
                elif kw == "endif" and stack:
                    stack.pop()
                # an include guard (#ifndef X_H) is no condition
                now = [c for c in stack if not re.match(r"^!\w+_(H|HPP|H_)_?$", c)]
                conds.append((off + len(line) + 1, " && ".join(now) or None))
            out.append(" " * len(line))
        else:
            out.append(line)
        off += len(line) + 1
    return "\n".join(out), conds


def cond_at(conds, pos):
    found = None
    for off, c in conds:
        if off > pos:
            break
        found = c
    return found


def match_bracket(s, i):
    """s[i] is ( [ or {: the index of its closing bracket."""
    depth = 0
    j = i
    while j < len(s):
        if is_quote(s, j):
            j = skip_string(s, j)
            continue
        if s[j] in OPEN:
            depth += 1
        elif s[j] in CLOSE:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(s) - 1


def match_angle(s, i):
    """s[i] is the '<' of a template argument list: the index of its '>'."""
    depth = 0
    j = i
    while j < len(s):
        c = s[j]
        if c in OPEN:
            j = match_bracket(s, j) + 1
            continue
        if c == '"':
            j = skip_string(s, j)
            continue
        if c == "<":
            depth += 1
        elif c == ">" and s[j - 1] != "-":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(s) - 1


def split_top(s, sep=","):
    """s split at the separators outside brackets, template arguments and strings."""
    parts = []
    depth = angle = 0
    start = j = 0
    while j < len(s):
        c = s[j]
        if is_quote(s, j):
            j = skip_string(s, j)
            continue
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
        elif c == "<" and depth == 0:
            # a template argument list follows an identifier (not << or <=)
            if j and (s[j - 1].isalnum() or s[j - 1] == "_") and s[j + 1:j + 2] not in ("<", "="):
                angle += 1
        elif c == ">" and depth == 0 and angle and s[j - 1] != "-":
            angle -= 1
        elif c == sep and depth == 0 and angle == 0:
            parts.append(s[start:j])
            start = j + 1
        j += 1
    parts.append(s[start:])
    return [p.strip() for p in parts if p.strip()]


def string_literal(tok):
    """The value of a C++ string literal (adjacent ones concatenated), or None."""
    tok = tok.strip()
    if not tok.startswith('"'):
        return None
    lit = r'"((?:[^"\\]|\\.)*)"'
    if re.sub(lit, "", tok).strip():
        return None
    v = "".join(re.findall(lit, tok))
    return v.encode("utf-8").decode("unicode_escape", errors="replace") if "\\" in v else v


def norm_ws(s):
    return re.sub(r"\s+", " ", s).strip()


def py_default(cpp):
    """A C++ default argument as Python would show it where the two agree."""
    cpp = norm_ws(cpp)
    return {"py::none()": "None", "pybind11::none()": "None", "nullptr": "None",
            "true": "True", "false": "False"}.get(cpp, cpp)


def parse_cpp_params(plist):
    """'const std::string& a, int b = 3' -> ['a', 'b=3'] ('_' for an unnamed one)."""
    plist = plist.strip()
    if plist in ("", "void"):
        return []
    out = []
    for p in split_top(plist):
        eq = split_top(p, "=")
        p, default = eq[0].strip(), ("=".join(eq[1:]) if len(eq) > 1 else None)
        m = re.search(r"(\w+)\s*(\[[^\]]*\])?$", p)
        name = "_"
        if m and p[:m.start()].strip() and not p[:m.start()].strip().endswith("::") \
                and m.group(1) not in ("int", "bool", "float", "double", "size_t"):
            name = m.group(1)
        out.append(name + ("=" + norm_ws(default) if default is not None else ""))
    return out


class CppTree:
    """The tree's C++ sources, preprocessed on demand."""

    def __init__(self, root):
        self.root = root
        self.raw = {}
        for dp, dn, fn in os.walk(root):
            dn[:] = sorted(d for d in dn if d not in SKIP_DIRS and d != "tests")
            for f in sorted(fn):
                if f.endswith((".cpp", ".h", ".hpp", ".cc", ".cu", ".cuh")):
                    p = os.path.join(dp, f)
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        self.raw[p] = fh.read()
        self._pre = {}

    def text(self, path):
        if path not in self._pre:
            self._pre[path] = preprocess(self.raw[path])
        return self._pre[path]

    def rel(self, path):
        return os.path.relpath(path, self.root)

    def modules(self):
        """[(path, PYBIND11_MODULE name)] of the tree."""
        out = []
        for p, raw in self.raw.items():
            if "PYBIND11_MODULE" in raw:
                for m in re.finditer(r"PYBIND11_MODULE\s*\(\s*(\w+)\s*,", self.text(p)[0]):
                    out.append((p, m.group(1)))
        return out

    def helper_body(self, name):
        """`void name(py::module_ &m) { ... }`: (path, its module variable, body start, end)."""
        pat = re.compile(r"\bvoid\s+(?:\w+::)*" + re.escape(name)
                         + r"\s*\(\s*(?:pybind11|py)::module_?\s*&\s*(\w+)\s*\)\s*\{")
        for p, raw in self.raw.items():
            if name in raw:
                text, _ = self.text(p)
                m = pat.search(text)
                if m:
                    b = m.end() - 1
                    return p, m.group(1), b + 1, match_bracket(text, b)
        return None

    def declared_params(self, qualname, near=None):
        """Parameter names of the declaration of Class::method or func (files in the
        directory `near` first, headers before sources)."""
        parts = qualname.split("::")
        name, cls = parts[-1], (parts[-2] if len(parts) > 1 else None)
        pat = re.compile(r"(?<![\w.>])" + re.escape(name) + r"\s*\(")
        order = sorted(self.raw, key=lambda p: (not (near and p.startswith(near)),
                                                not p.endswith((".h", ".hpp")), p))
        for p in order:
            raw = self.raw[p]
            if name not in raw or (cls and cls not in raw):
                continue
            text, _ = self.text(p)
            for m in pat.finditer(text):
                before = text[max(0, m.start() - 120):m.start()]
                # a declaration follows a type or Class::, a call follows an operator
                if re.search(r"(return|=|\.|->|\(|,|!|&&|\|\|)\s*$", before) \
                        or not re.search(r"[\w>&*:]\s*$", before) \
                        or re.search(r"\b(if|while|for|switch|sizeof|decltype)\s*$", before):
                    continue
                o = m.end() - 1
                c = match_bracket(text, o)
                if re.match(r"\s*(const\s*)?(noexcept\s*)?(override\s*)?(final\s*)?(->[^;{]*)?"
                            r"(;|\{|=\s*0|=\s*default|=\s*delete|:)", text[c + 1:c + 80]):
                    return parse_cpp_params(text[o + 1:c])
        return None


# ---------------------------------------------------------------------------------------
# pybind11 modules
# ---------------------------------------------------------------------------------------

ARG_RE = re.compile(r'^py(?:bind11)?::arg(?:_v)?\s*\(\s*"([^"]+)"\s*\)'
                    r'((?:\s*\.\s*\w+\s*\([^()]*\))*)\s*(?:=\s*(.*))?$', re.S)
LITERAL_ARG_RE = re.compile(r'^"([^"]+)"_a\s*(?:=\s*(.*))?$', re.S)
PROPERTY_DEFS = ("def_readwrite", "def_readonly", "def_property", "def_property_readonly",
                 "def_readwrite_static", "def_readonly_static", "def_property_static",
                 "def_property_readonly_static")


def lambda_params(expr):
    """[(name, 'p' | 'args' | 'kwargs')] of a lambda `[...](params) {...}`, or None."""
    expr = expr.strip()
    if not expr.startswith("["):
        return None
    rest = expr[match_bracket(expr, 0) + 1:].lstrip()
    if not rest.startswith("("):
        return []
    out = []
    for p in split_top(rest[1:match_bracket(rest, 0)]):
        decl = split_top(p, "=")[0]
        m = re.search(r"(\w+)\s*$", decl)
        kind = ("args" if re.search(r"\bpy(?:bind11)?::args\b", decl)
                else "kwargs" if re.search(r"\bpy(?:bind11)?::kwargs\b", decl) else "p")
        out.append((m.group(1) if m else "_", kind))
    return out


class PybindModule:
    """The names a PYBIND11_MODULE body defines, with the bind_*(m) helpers it calls."""

    def __init__(self, tree, path, token):
        self.tree = tree
        self.names = {}
        self.sources = [tree.rel(path)]
        self.submodules = []
        self.classes = {}  # C++ variable -> Python class name
        text, conds = tree.text(path)
        m = re.search(r"PYBIND11_MODULE\s*\(\s*" + re.escape(token) + r"\s*,\s*(\w+)\s*\)\s*\{",
                      text)
        b = m.end() - 1
        self._block(path, {m.group(1)}, b + 1, match_bracket(text, b))

    def _block(self, path, mod_vars, start, end):
        """The statements of text[start:end], nested plain blocks included."""
        text, conds = self.tree.text(path)
        pos = stmt = start
        while pos < end:
            c = text[pos]
            if is_quote(text, pos):
                pos = skip_string(text, pos)
            elif c in "([":
                pos = match_bracket(text, pos) + 1
            elif c == "{":
                close = match_bracket(text, pos)
                head = text[stmt:pos].strip()
                if head == "" or re.match(r"^(if|else|for|while|do|try)\b", head):
                    self._block(path, mod_vars, pos + 1, close)
                    stmt = close + 1
                pos = close + 1
            elif c == ";":
                self._statement(path, mod_vars, stmt, text[stmt:pos], conds)
                pos += 1
                stmt = pos
            else:
                pos += 1

    def _statement(self, path, mod_vars, off, stmt, conds):
        s = stmt.strip()
        if not s:
            return
        off += len(stmt) - len(stmt.lstrip())
        cond = cond_at(conds, off)

        def abs_of(rest):  # the file offset of `rest`, a suffix of s
            return off + len(s) - len(rest)

        # bind_foo(m): a helper defining more names on the module
        m = re.match(r"^(?:[\w:]*::)?(\w+)\s*\(\s*(\w+)\s*\)$", s)
        if m and m.group(2) in mod_vars:
            found = self.tree.helper_body(m.group(1))
            if found:
                p, var, b, e = found
                if self.tree.rel(p) not in self.sources:
                    self.sources.append(self.tree.rel(p))
                self._block(p, {var}, b, e)
            return
        # m.attr("X") = value / cls.attr("X") = value
        m = re.match(r'^(\w+)\s*\.\s*attr\s*\(\s*"(\w+)"\s*\)\s*=\s*(.*)$', s, re.S)
        if m:
            var, name, value = m.group(1), m.group(2), norm_ws(m.group(3))
            if var in mod_vars:
                self._attr(name, value, cond)
            elif var in self.classes and self.classes[var] in self.names:
                self.names[self.classes[var]]["members"][name] = {"kind": "attr"}
            return
        # py::class_<T...> var(m, "Name", ...) / py::enum_<T>(m, "Name") ...
        m = re.match(r"^(?:(?:auto|py::class_<[^;]*?>|py::enum_<[^;]*?>)\s+(\w+)\s*=\s*)?"
                     r"(?:py|pybind11)::(class_|enum_|exception|register_exception)\s*<", s)
        if m:
            var = m.group(1)
            rest = s[match_angle(s, s.index("<", m.end() - 1)) + 1:].lstrip()
            mv = re.match(r"^(\w+)\s*\(", rest)
            if mv:
                var = mv.group(1)
                rest = rest[mv.end() - 1:]
            if not rest.startswith("("):
                return
            close = match_bracket(rest, 0)
            args = split_top(rest[1:close])
            name = string_literal(args[1]) if len(args) > 1 else None
            if name is None:
                return
            kind = "enum" if m.group(2) == "enum_" else "class"
            entry = {"kind": kind}
            if kind == "enum":
                entry["values"] = []
            entry["members"] = {}
            if kind == "class" and any("py::buffer_protocol" in a for a in args[2:]):
                entry["buffer_protocol"] = True
            if cond:
                entry["cond"] = cond
            if name not in self.names:
                self.names[name] = entry
            if var:
                self.classes[var] = name
            tail = rest[close + 1:]
            self._chain(tail, abs_of(tail), name, conds, path)
            return
        # var.def(...).def(...)...
        m = re.match(r"^(\w+)\s*\.", s)
        if m:
            tail = s[len(m.group(1)):]
            if m.group(1) in mod_vars:
                self._chain(tail, abs_of(tail), None, conds, path)
            elif m.group(1) in self.classes:
                self._chain(tail, abs_of(tail), self.classes[m.group(1)], conds, path)
            return
        m = re.match(r'^auto\s+\w+\s*=\s*\w+\s*\.\s*def_submodule\s*\(\s*"(\w+)"', s)
        if m:
            self.submodules.append(m.group(1))

    def _attr(self, name, value, cond):
        ma = re.match(r'^\w+\s*\.\s*attr\s*\(\s*"(\w+)"\s*\)$', value)
        if name in self.names:
            # set on both sides of an #ifdef: no condition
            self.names[name].pop("cond", None)
            if "expr" in self.names[name] and self.names[name]["expr"] != value:
                self.names[name]["expr"] += " | " + value
            return
        entry = {"kind": "attr"}
        if ma:
            entry["alias_of"] = ma.group(1)
        else:
            entry["expr"] = value
        if cond:
            entry["cond"] = cond
        self.names[name] = entry

    def _chain(self, rest, rest_off, clsname, conds, path):
        """`.call(args).call(args)...` on the module (clsname None) or on a class."""
        i = 0
        while True:
            m = re.compile(r"\s*\.\s*(\w+)\s*").match(rest, i)
            if not m or m.end() >= len(rest) or rest[m.end()] != "(":
                break
            close = match_bracket(rest, m.end())
            cond = cond_at(conds, rest_off + m.start(1))
            self._call(clsname, m.group(1), split_top(rest[m.end() + 1:close]), cond, path)
            i = close + 1
        m = re.match(r'^\.\s*attr\s*\(\s*"(\w+)"\s*\)\s*=\s*(.*)$', rest[i:].strip(), re.S)
        if m and clsname is None:
            self._attr(m.group(1), norm_ws(m.group(2)), None)

    def _call(self, clsname, meth, args, cond, path):
        if clsname is None:
            name = string_literal(args[0]) if args else None
            if name is None:
                return
            if meth == "def_submodule":
                self.submodules.append(name)
            elif meth == "def":
                add_overload(self.names, name, "function",
                             self._def(args[1:], True, cond, path))
            return
        cls = self.names.get(clsname)
        if cls is None:
            return
        members = cls["members"]
        name = string_literal(args[0]) if args else None
        if meth == "value" and name is not None:
            cls.setdefault("values", []).append(name)
        elif meth == "export_values":
            cls["export_values"] = True
        elif meth == "def" and args and re.match(r"^py(?:bind11)?::init\b", args[0]):
            add_overload(members, "__init__", "method", self._init(args[0], args[1:], cond))
        elif meth == "def" and name is not None:
            add_overload(members, name, "method", self._def(args[1:], False, cond, path))
        elif meth == "def" and args:
            op = re.match(r"^py::self\s*(\S+)\s*py::self$", args[0])
            if op:
                cls.setdefault("operators", []).append(op.group(1))
        elif meth == "def_static" and name is not None:
            add_overload(members, name, "staticmethod", self._def(args[1:], True, cond, path))
        elif meth in PROPERTY_DEFS and name is not None:
            readonly = "readonly" in meth or (
                meth == "def_property" and len(args) >= 3
                and re.match(r"^(nullptr|py::cpp_function\(\))$", args[2].strip()) is not None)
            entry = {"kind": "property", "readonly": readonly}
            if "static" in meth:
                entry["static"] = True
            if cond:
                entry["cond"] = cond
            members[name] = entry
        elif meth == "def_buffer":
            cls["buffer_protocol"] = True

    @staticmethod
    def _py_args(args):
        """The py::arg(...) list of a def as params (None when it has none)."""
        params = []
        for a in args:
            m = ARG_RE.match(a)
            default = m and m.group(3)
            if not m:
                m = LITERAL_ARG_RE.match(a)
                default = m and m.group(2)
            if m:
                params.append(m.group(1) + ("=" + py_default(default) if default else ""))
            elif re.match(r"^py::kw_only\s*\(\s*\)$", a):
                params.append("*")
            elif re.match(r"^py::pos_only\s*\(\s*\)$", a):
                params.append("/")
        return params if any(p not in ("*", "/") for p in params) else None

    def _def(self, args, free, cond, path):
        """.def("name", impl, extras...): args is [impl, extras...]; free: not a method
        (no self to drop)."""
        impl = args[0] if args else ""
        named = self._py_args(args[1:])
        lam = lambda_params(impl)
        if lam is not None and not free and lam:
            lam = lam[1:]  # self
        if named is not None:
            params = named
            if lam and any(k != "p" for _, k in lam):
                # py::args / py::kwargs parameters take no py::arg
                it = iter(p for p in named if p not in ("*", "/"))
                params = [("*" + n) if k == "args" else ("**" + n) if k == "kwargs"
                          else next(it, n) for n, k in lam]
        else:
            # no py::arg: the arguments go by position only (pybind11 names them arg0...)
            cpp = self._cpp_params(impl, lam, path)
            params = None
            if cpp is not None:
                params = [p.split("=", 1)[0] for p in cpp] + (["/"] if cpp else [])
        entry = {"params": params}
        if cond:
            entry["cond"] = cond
        return entry

    def _cpp_params(self, impl, lam, path):
        if lam is not None:
            return [n for n, _ in lam]
        m = re.match(r"^static_cast\s*<.*?\(\s*[\w:]*::\*\s*\)\s*\(([^)]*)\)", impl, re.S)
        if m:
            return [f"arg{i}" for i, _ in enumerate(split_top(m.group(1)))]
        m = re.match(r"^py::overload_cast<(.*)>\s*\(\s*&\s*([\w:]+)", impl, re.S)
        if m:
            return [f"arg{i}" for i, _ in enumerate(split_top(m.group(1)))]
        m = re.match(r"^&\s*([\w:]+)", impl)
        if m:
            return self.tree.declared_params(m.group(1), near=os.path.dirname(path))
        return None

    def _init(self, init, extras, cond):
        params = self._py_args(extras)
        if params is None:
            m = re.match(r"^py(?:bind11)?::init\s*<(.*)>\s*\(\s*\)$", init, re.S)
            if m:
                types = split_top(m.group(1))
                params = [f"arg{i}" for i in range(len(types))] + (["/"] if types else [])
            else:
                m = re.match(r"^py(?:bind11)?::init\s*\((.*)\)$", init, re.S)
                lam = lambda_params(m.group(1)) if m else None
                params = None if lam is None else [n for n, _ in lam] + (["/"] if lam else [])
        entry = {"params": params}
        if cond:
            entry["cond"] = cond
        return entry


def add_overload(container, name, kind, entry):
    """container[name] = {kind, **entry}; a second def of name makes it overloads."""
    old = container.get(name)
    if old is not None and old.get("kind") == kind:
        if "overloads" not in old:
            first = {k: old.pop(k) for k in list(old) if k != "kind"}
            old["overloads"] = [first]
        old["overloads"].append(entry)
        return
    container[name] = {"kind": kind, **entry}


# ---------------------------------------------------------------------------------------
# The CPython extension
# ---------------------------------------------------------------------------------------

def c_extension_names(path):
    """{name: entry} of the PyMethodDef tables of a C file."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text, _ = preprocess(fh.read())
    names = {}
    for m in re.finditer(r"PyMethodDef\s+\w+\s*\[\s*\]\s*=\s*\{", text):
        table = text[m.end() - 1:match_bracket(text, m.end() - 1)]
        for e in re.finditer(r'\{\s*"(\w+)"\s*,\s*(?:\([^)]*\)\s*)*(\w+)\s*,\s*([\w\s|]+?)\s*,',
                             table):
            names[e.group(1)] = {"kind": "function",
                                 "params": c_params(text, e.group(2), e.group(3))}
    return names


def c_params(text, cfunc, flags):
    if "METH_NOARGS" in flags:
        return []
    if "METH_O" in flags:
        return ["arg", "/"]
    m = re.search(r"\b" + re.escape(cfunc) + r"\s*\([^)]*\)\s*\{", text)
    if not m:
        return None
    body = text[m.end() - 1:match_bracket(text, m.end() - 1)]
    kw = re.search(r"\w*kw\w*\s*\[\s*\]\s*=\s*\{([^}]*)\}", body)
    fmt = re.search(r'PyArg_ParseTuple(AndKeywords)?\s*\((?:[^,]+,){%d}\s*"([^"]*)"'
                    % (2 if kw else 1), body)
    if not fmt:
        return None
    units = re.findall(r"\||\$|[a-zA-Z](?:[#*!&]|\([^)]*\))?|\([^)]*\)",
                       re.split(r"[:;]", fmt.group(2))[0])
    names = re.findall(r'"(\w*)"', kw.group(1)) if kw else []
    out, optional, i = [], False, 0
    for u in units:
        if u == "|":
            optional = True
        elif u == "$":
            out.append("*")
        else:
            name = names[i] if i < len(names) and names[i] else f"arg{i}"
            out.append(name + ("=..." if optional else ""))
            i += 1
    if not kw and out:
        out.append("/")
    return out


# ---------------------------------------------------------------------------------------
# Python modules
# ---------------------------------------------------------------------------------------

def unparse(node, limit=100):
    s = norm_ws(ast.unparse(node))
    return s if len(s) <= limit else s[:limit - 3] + "..."


def is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def py_params(args, drop_first=False):
    """An ast.arguments as params."""
    pos = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    out = []
    for i, (a, d) in enumerate(zip(pos, defaults)):
        if not (i == 0 and drop_first):
            out.append(a.arg + ("=" + unparse(d) if d is not None else ""))
        if args.posonlyargs and i == len(args.posonlyargs) - 1 and out:
            out.append("/")
    if args.vararg:
        out.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        out.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(a.arg + ("=" + unparse(d) if d is not None else ""))
    if args.kwarg:
        out.append("**" + args.kwarg.arg)
    return out


def decorator_names(node):
    return [unparse(d) for d in node.decorator_list]


def py_function(node, in_class=False):
    decs = decorator_names(node)
    kind = "function"
    if in_class:
        kind = ("staticmethod" if "staticmethod" in decs else
                "classmethod" if "classmethod" in decs else
                "property" if any(d == "property" or d.endswith((".getter", "cached_property"))
                                  for d in decs) else "method")
    if kind == "property":
        return {"kind": kind, "readonly": True}
    entry = {"kind": kind, "params": py_params(node.args,
                                               drop_first=in_class and kind != "staticmethod")}
    if isinstance(node, ast.AsyncFunctionDef):
        entry["async"] = True
    return entry


ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def py_class(node, keep):
    bases = [unparse(b) for b in node.bases]
    is_enum = any(b.rsplit(".", 1)[-1] in ENUM_BASES for b in bases)
    entry = {"kind": "enum" if is_enum else "class"}
    members, values, fields, omitted = {}, [], [], []
    for st in node.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if st.name.startswith("_") and not is_dunder(st.name) and st.name not in keep:
                omitted.append(st.name)
                continue
            if st.name in members and members[st.name]["kind"] == "property":
                if any(d.endswith(".setter") for d in decorator_names(st)):
                    members[st.name]["readonly"] = False
                continue
            members[st.name] = py_function(st, in_class=True)
        elif isinstance(st, ast.ClassDef) and not st.name.startswith("_"):
            members[st.name] = py_class(st, keep)
        elif isinstance(st, (ast.Assign, ast.AnnAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                if not isinstance(t, ast.Name) or (t.id.startswith("_") and t.id not in keep):
                    continue
                if is_enum:
                    values.append(t.id)
                else:
                    members[t.id] = {"kind": "attr"}
                    if isinstance(st, ast.AnnAssign) and "ClassVar" not in unparse(st.annotation):
                        fields.append(t.id + ("=" + unparse(st.value) if st.value is not None
                                              else ""))
    if is_enum:
        entry["values"] = values
    dataclass = [d for d in decorator_names(node) if d.split("(")[0].endswith("dataclass")]
    if dataclass and "__init__" not in members and "init=False" not in dataclass[0]:
        # the __init__ @dataclass writes (fields of dataclass bases not included)
        kw_only = "kw_only=True" in dataclass[0] and fields
        members["__init__"] = {"kind": "method", "params": ["*"] * bool(kw_only) + fields}
    entry["members"] = members
    if omitted:
        entry["private_omitted"] = omitted
    return entry


def resolve_from(modname, is_pkg, node):
    """The absolute module of `from ... import` inside module modname."""
    if node.level == 0:
        return node.module or ""
    parts = modname.split(".")
    if not is_pkg:
        parts = parts[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts) + ("." + node.module if node.module else "")


def literal(node):
    """(True, value) for a JSON-able literal, else (False, None)."""
    try:
        v = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return True, v
    return False, None


def python_module(path, modname, is_pkg, keep):
    """The module's entry: names bound at its top level (also in if/try/with blocks);
    a _name only when in keep (other Mooncake code uses it)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        tree = ast.parse(fh.read(), filename=path)
    names, omitted, dynamic = {}, [], []
    all_names = None

    def wanted(name):
        if name.startswith("_") and name not in keep:
            if not is_dunder(name):
                omitted.append(name)
            return False
        return True

    def put(name, entry, guard):
        if name in names and guard and guard.startswith(("except", "else")):
            return  # the fallback of a binding made in the try / if body
        if guard:
            entry["guard"] = guard
        names[name] = entry

    def visit(body, guard=None):
        nonlocal all_names
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if wanted(st.name):
                    put(st.name, py_function(st), guard)
            elif isinstance(st, ast.ClassDef):
                if wanted(st.name):
                    put(st.name, py_class(st, keep), guard)
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                for t in targets:
                    for n in ([t] if isinstance(t, ast.Name) else
                              t.elts if isinstance(t, ast.Tuple) else []):
                        if not isinstance(n, ast.Name) or is_dunder(n.id) and n.id != "__all__":
                            continue
                        if n.id == "__all__":
                            try:
                                all_names = list(ast.literal_eval(st.value))
                            except ValueError:
                                pass
                            continue
                        if not wanted(n.id):
                            continue
                        entry = {"kind": "attr"}
                        if st.value is not None:
                            ok, v = literal(st.value) if isinstance(t, ast.Name) else (False, None)
                            if ok:
                                entry["value"] = v
                            elif isinstance(st.value, ast.Name) and isinstance(t, ast.Name):
                                entry["alias_of"] = st.value.id
                            else:
                                entry["expr"] = unparse(st.value)
                        put(n.id, entry, guard)
            elif isinstance(st, ast.ImportFrom):
                src = resolve_from(modname, is_pkg, st)
                for al in st.names:
                    name = al.asname or al.name
                    if al.name != "*" and src.split(".")[0] == "mooncake" and wanted(name):
                        put(name, {"kind": "attr", "from": src + "." + al.name}, guard)
            elif isinstance(st, ast.Import):
                for al in st.names:
                    if al.name.startswith("mooncake.") and al.asname and wanted(al.asname):
                        put(al.asname, {"kind": "module", "from": al.name}, guard)
            elif isinstance(st, ast.If):
                test = unparse(st.test, 60)
                if test != "__name__ == '__main__'":
                    visit(st.body, "if " + test)
                    visit(st.orelse, "else of if " + test)
            elif isinstance(st, ast.Try):
                visit(st.body, "try")
                for h in st.handlers:
                    visit(h.body, "except " + (unparse(h.type, 40) if h.type else ""))
                visit(st.orelse, "try")
                visit(st.finalbody, guard)
            elif isinstance(st, ast.With):
                visit(st.body, guard)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                    and unparse(st.value.func).startswith("globals().update"):
                dynamic.append(unparse(st.value, 160))

    visit(tree.body)
    for name in all_names or []:
        if name not in names:
            names[name] = {"kind": "attr", "note": "in __all__, bound outside this file"}
    mod = {"kind": "python", "names": names}
    if dynamic:
        mod["dynamic"] = dynamic
    if omitted:
        mod["private_omitted"] = sorted(set(omitted))
    return mod


# ---------------------------------------------------------------------------------------
# Private names other Mooncake code uses
# ---------------------------------------------------------------------------------------

def python_private_uses(files, root):
    """{(module, _name): [paths]} for _names that Python files import from a mooncake
    module or read as an attribute of one (or of one of its classes)."""
    uses = {}
    for path, modname, is_pkg in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                tree = ast.parse(fh.read(), filename=path)
        except SyntaxError:
            continue
        rel = os.path.relpath(path, root)
        aliases = {}  # local name -> the mooncake module or name it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = resolve_from(modname, is_pkg, node) if modname else (node.module or "")
                if not src.startswith("mooncake"):
                    continue
                for al in node.names:
                    if al.name.startswith("_") and not is_dunder(al.name):
                        uses.setdefault((src, al.name), set()).add(rel)
                    else:
                        aliases[al.asname or al.name] = src + "." + al.name
            elif isinstance(node, ast.Import):
                for al in node.names:
                    if al.name.startswith("mooncake"):
                        if al.asname:
                            aliases[al.asname] = al.name
                        else:
                            aliases[al.name.split(".")[0]] = al.name.split(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not is_dunder(node.attr):
                base = unparse(node.value, 200)
                head = base.split(".")[0]
                if head in aliases:
                    uses.setdefault((aliases[head] + base[len(head):], node.attr), set()).add(rel)
    return uses


def text_private_uses(root, names, exclude):
    """{_name: [paths]} of the .cpp/.h/.py files other than `exclude` that name one of
    `names` as a string ("_x", getattr or a C++ attr() lookup), an attribute or an import."""
    found = {}
    pats = {n: re.compile(r'"' + re.escape(n) + r'"|\.' + re.escape(n) + r"\b|import\b[^\n]*\b"
                          + re.escape(n) + r"\b") for n in names}
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(d for d in dn if d not in SKIP_DIRS)
        for f in sorted(fn):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)
            if not f.endswith((".cpp", ".h", ".py")) or rel in exclude:
                continue
            with open(p, encoding="utf-8", errors="replace") as fh:
                t = fh.read()
            for n, pat in pats.items():
                if n in t and pat.search(t):
                    found.setdefault(n, set()).add(rel)
    return found


# ---------------------------------------------------------------------------------------
# The tree
# ---------------------------------------------------------------------------------------

def package_python_files(root):
    """[(path, module, is_package)] of the Python files installed into `mooncake`."""
    out = []

    def walk(base, prefix):
        for dp, dn, fn in os.walk(base):
            dn[:] = sorted(d for d in dn if d not in ("__pycache__", "tests"))
            for f in sorted(fn):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dp, f), base)[:-3].split(os.sep)
                    is_pkg = rel[-1] == "__init__"
                    out.append((os.path.join(dp, f),
                                ".".join([prefix] + (rel[:-1] if is_pkg else rel)), is_pkg))

    walk(os.path.join(root, "mooncake-wheel", "mooncake"), "mooncake")
    for rel in INTEGRATION_PY:
        p = os.path.join(root, "mooncake-integration", rel)
        if os.path.exists(p):
            out.append((p, "mooncake." + os.path.basename(rel)[:-3], False))
    walk(os.path.join(root, "mooncake-reshard", "python", "mooncake", "reshard"),
         "mooncake.reshard")
    return out


def all_python_files(root, skip):
    out = []
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(d for d in dn if d not in SKIP_DIRS)
        out += [(os.path.join(dp, f), None, False) for f in sorted(fn)
                if f.endswith(".py") and os.path.join(dp, f) not in skip]
    return out


def resolve_aliases(modules):
    """`from` for alias_of (a name of the same module); kind of the name `from` leads to."""
    for modname, mod in modules.items():
        for name, e in mod["names"].items():
            if "alias_of" in e:
                alias = e.pop("alias_of")
                if alias in mod["names"]:
                    e["from"] = modname + "." + alias
                else:  # bound to something the module does not export
                    e["expr"] = alias

    def target(full, seen=()):
        mod, _, name = full.rpartition(".")
        if full in modules:
            return {"kind": "module"}
        e = modules.get(mod, {}).get("names", {}).get(name)
        if e is None or full in seen:
            return None
        return target(e["from"], seen + (full,)) if "from" in e else e

    for mod in modules.values():
        for e in mod["names"].values():
            if "from" in e:
                t = target(e["from"])
                if t is not None:
                    e["kind"] = t["kind"]


def build(root):
    root = os.path.abspath(root)
    cpp = CppTree(root)
    modules = {}
    excluded = {}
    native_sources = set()
    for path, token in sorted(cpp.modules()):
        rel = cpp.rel(path)
        skip = next((why for pre, why in PYBIND_NOT_IN_PACKAGE.items() if rel.startswith(pre)),
                    None)
        if skip:
            excluded[rel] = skip
            continue
        modname = PYBIND_MODULE_PATHS.get(token)
        if modname is None:
            modname = "mooncake." + token
            print(f"inventory.py: {rel}: PYBIND11_MODULE({token}) is new: taken as {modname}; "
                  "add it to PYBIND_MODULE_PATHS", file=sys.stderr)
        pm = PybindModule(cpp, path, token)
        mod = {"kind": "pybind11", "source": pm.sources, "names": pm.names}
        if pm.submodules:
            mod["submodules"] = pm.submodules
        modules[modname] = mod
        native_sources.update(pm.sources)
    for rel, modname in C_EXTENSIONS.items():
        p = os.path.join(root, rel)
        if os.path.exists(p):
            modules[modname] = {"kind": "c-extension", "source": [rel],
                                "names": c_extension_names(p)}
            native_sources.add(rel)

    files = package_python_files(root)
    uses = python_private_uses(files + all_python_files(root, {p for p, _, _ in files}), root)
    for path, modname, is_pkg in files:
        keep = {n for (m, n) in uses if m == modname}
        keep |= {n for (m, n) in uses if m.startswith(modname + ".")}  # Class._member
        mod = python_module(path, modname, is_pkg, keep)
        mod["source"] = [os.path.relpath(path, root)]
        for name, e in mod["names"].items():
            if name.startswith("_") and not is_dunder(name):
                e["private"] = True
                e["used_by"] = sorted(uses.get((modname, name), ()))
        modules[modname] = mod

    # the _names of the native modules: kept where other code uses them
    private = set()
    for mod in modules.values():
        if mod["kind"] != "python":
            for name, e in mod["names"].items():
                private |= {n for n in [name] + list(e.get("members", {}))
                            if n.startswith("_") and not is_dunder(n)}
    text_uses = text_private_uses(root, private, native_sources)
    for modname, mod in modules.items():
        if mod["kind"] == "python":
            continue
        omitted = []
        for name in list(mod["names"]):
            e = mod["names"][name]
            if name.startswith("_"):
                who = text_uses.get(name, set()) | uses.get((modname, name), set())
                if not who:
                    omitted.append(name)
                    del mod["names"][name]
                    continue
                e["private"] = True
                e["used_by"] = sorted(who)
            for mname in list(e.get("members", {})):
                if mname.startswith("_") and not is_dunder(mname):
                    who = text_uses.get(mname, set())
                    if who:
                        e["members"][mname].update(private=True, used_by=sorted(who))
                    else:
                        e.setdefault("private_omitted", []).append(mname)
                        del e["members"][mname]
        if omitted:
            mod["private_omitted"] = omitted
        # export_values(): an enum's members are module attributes too (a later enum's
        # member replacing an earlier one's)
        exported = {}
        for name, e in mod["names"].items():
            if e["kind"] == "enum" and e.pop("export_values", False):
                exported.update({v: f"{modname}.{name}.{v}" for v in e.get("values", [])})
        for v, full in exported.items():
            mod["names"].setdefault(v, {"kind": "attr", "from": full, "note": "export_values()"})

    resolve_aliases(modules)
    for modname, mod in modules.items():
        for e in mod["names"].values():
            members = e.pop("members", None)
            if members:  # last in the entry, for reading
                e["members"] = members
        order = ("kind", "source", "submodules", "dynamic", "private_omitted", "names")
        modules[modname] = {k: mod[k] for k in order if k in mod}
    return modules, excluded


def git_head(tree):
    try:
        out = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        top = subprocess.run(["git", "-C", tree, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out if os.path.realpath(top) == os.path.realpath(tree) else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", help="Mooncake's source tree (a checkout or an export)")
    ap.add_argument("--commit", help="the commit the tree is (default: the checkout's HEAD)")
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(args.tree, "mooncake-integration")):
        ap.error(f"{args.tree}: no mooncake-integration/ here: not a Mooncake tree")
    commit = args.commit or git_head(args.tree)
    if not commit:
        ap.error(f"{args.tree} is not a git checkout: name its commit with --commit")
    modules, excluded = build(args.tree)
    out = {
        "generator": "tests/mooncake/inventory.py",
        "generator_version": GENERATOR_VERSION,
        "mooncake": {"repository": REPOSITORY, "commit": commit},
        "not_in_package": excluded,
        "modules": modules,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
