"""The codebase's habits, held: no function in raystudy/ or analysis/ over 60 lines (the training
loop, read top to bottom, excepted), a docstring on every public function and method, and tests
that mirror the tree (tests/<pkg>/test_<mod>.py for raystudy/<pkg>/<mod>.py)."""

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


def _names_a_module(folder: Path, stem: str) -> bool:
    """Whether ``stem`` (a test file's name past ``test_``) is a module or package in ``folder``, or one
    of them on one aspect: ``load`` is load.py, ``stats`` the package, ``load_mlflow`` load.py on MLflow."""
    if not folder.is_dir():
        return False
    names = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    return any(stem == name or stem.startswith(name + "_") for name in names)


def _misnamed_tests(tests: list[str]) -> list[str]:
    """The test files (paths under tests/) out of the mirror: tests/<dirs>/test_<mod>[_aspect].py must
    name a module of raystudy/<dirs>/ (of analysis/... when <dirs> starts with analysis), and a test at
    the top is cross-cutting, so not named after a package (tests/test_models_x.py is tests/models/'s)."""
    packages = {p.name for p in (ROOT / "raystudy").iterdir() if (p / "__init__.py").exists()} | {"analysis"}
    bad = []
    for path in tests:
        *dirs, name = path.split("/")
        stem = name.removeprefix("test_").removesuffix(".py")
        if not dirs:
            if any(stem == pkg or stem.startswith(pkg + "_") for pkg in packages):
                bad.append(path)
            continue
        folder = ROOT.joinpath(*dirs) if dirs[0] == "analysis" else ROOT.joinpath("raystudy", *dirs)
        if not _names_a_module(folder, stem):
            bad.append(path)
    return bad


def test_each_package_test_names_a_module_that_exists():
    # a module renamed or moved leaves its test file's path pointing nowhere: caught here; and each
    # folder is a package, so that two folders may hold test files of the same name
    tests = sorted(p.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert not _misnamed_tests(tests), "\n".join(_misnamed_tests(tests))
    folders = {p.parent for p in (ROOT / "tests").rglob("test_*.py")}
    assert not [f for f in folders if not (f / "__init__.py").is_file()], "a tests/ folder without __init__.py"


def test_the_module_check_sees_what_it_should():
    names = [
        "models/test_registry.py",
        "analysis/test_stats.py",
        "analysis/stats/test_paired.py",
        "analysis/test_load_mlflow.py",
        "driver/test_tune_state.py",
        "test_e2e.py",
        "test_bounds.py",
        "models/test_nothing.py",
        "analysis/stats/test_nothing.py",
        "analysis/test_mlflow.py",
        "nowhere/test_grid.py",
        "test_models_registry.py",
        "test_analysis_load.py",
    ]
    assert _misnamed_tests(names) == [
        "models/test_nothing.py",
        "analysis/stats/test_nothing.py",
        "analysis/test_mlflow.py",
        "nowhere/test_grid.py",
        "test_models_registry.py",
        "test_analysis_load.py",
    ]
