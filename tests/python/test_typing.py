"""kvpool's type stubs (kvpool/__init__.pyi, with py.typed) and its help text: the stub
names every public name of the package and every public method of kvpool.Client, with
the same parameters; every public method has a docstring, and help(kvpool.Client) shows
them."""

import ast
import inspect
import os
import pydoc

import kvpool


def _stub():
    path = os.path.join(os.path.dirname(kvpool.__file__), "__init__.pyi")
    assert os.path.exists(path), "kvpool/__init__.pyi is not installed next to the package"
    assert os.path.exists(os.path.join(os.path.dirname(kvpool.__file__), "py.typed"))
    return ast.parse(open(path).read())


def test_stub_covers_the_package():
    tree = _stub()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets)
    public = {n for n in dir(kvpool) if not n.startswith("_")} - {"aio"}
    assert public - names == set(), "missing from kvpool/__init__.pyi"
    assert "__version__" in names


def test_stub_covers_client_methods_with_their_parameters():
    cls = next(n for n in _stub().body if isinstance(n, ast.ClassDef) and n.name == "Client")
    stub = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for name, fn in inspect.getmembers(kvpool.Client):
        if name.startswith("_") or not (inspect.isfunction(fn) or isinstance(fn, property)):
            continue
        assert name in stub, f"Client.{name} missing from the stub"
        if inspect.isfunction(fn):
            a = stub[name].args
            want = [p for p in inspect.signature(fn).parameters]
            got = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            got += [a.vararg.arg] if a.vararg else []
            got += [a.kwarg.arg] if a.kwarg else []
            assert sorted(got) == sorted(want), f"Client.{name}: stub {got}, code {want}"


def test_every_public_method_has_a_docstring_and_help_shows_them():
    for cls in (kvpool.Client, kvpool.Error, kvpool.BufferHandle):
        for name, fn in inspect.getmembers(cls):
            if name.startswith("_") or not callable(fn):
                continue
            assert (fn.__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
    text = pydoc.render_doc(kvpool.Client, renderer=pydoc.plaintext)
    for name in ("put", "get_into", "batch_get_into_multi", "register_buffer", "aget"):
        assert f"{name}(" in text
    assert "A connection to a kvpool master" in text
