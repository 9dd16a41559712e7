"""The codebase's habits, held: no function in raystudy/ or analysis/ over 60 lines (the training
loop, read top to bottom, excepted), and a docstring on every public function and method."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60
EXEMPT = {("raystudy/train/engine.py", "_train")}  # the training loop: one readable pass, phases in order


def _files():
    for pkg in ("raystudy", "analysis"):
        yield from sorted((ROOT / pkg).rglob("*.py"))


def _functions(tree: ast.AST):
    """(qualified name, node, public) of every function and method, nested ones included."""

    def visit(node, prefix, public):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                pub = public and not child.name.startswith("_")
                if not isinstance(child, ast.ClassDef):
                    yield name, child, pub and isinstance(node, (ast.Module, ast.ClassDef))
                yield from visit(child, name + ".", pub and isinstance(child, ast.ClassDef))

    yield from visit(tree, "", True)


def test_no_function_is_over_60_lines():
    long = []
    for f in _files():
        rel = f.relative_to(ROOT).as_posix()
        for name, node, _ in _functions(ast.parse(f.read_text())):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES and (rel, name) not in EXEMPT:
                long.append(f"{rel}: {name} ({n} lines)")
    assert not long, "\n".join(long)


def test_every_public_function_has_a_docstring():
    bare = [
        f"{f.relative_to(ROOT).as_posix()}:{node.lineno} {name}"
        for f in _files()
        for name, node, public in _functions(ast.parse(f.read_text()))
        if public and ast.get_docstring(node) is None
    ]
    assert not bare, "\n".join(bare)


def test_the_checks_see_what_they_should():
    code = (
        "def f():\n"
        + "    x = 1\n" * 70
        + "class C:\n    def m(self):\n        pass\n    def _p(self):\n        pass\n"
    )
    found = {name: (node.end_lineno - node.lineno + 1, pub) for name, node, pub in _functions(ast.parse(code))}
    assert found == {"f": (71, True), "C.m": (2, True), "C._p": (2, False)}
