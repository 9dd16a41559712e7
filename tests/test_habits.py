"""The codebase's habits, held: no function in raystudy/ or analysis/ over 60 lines (the training
loop, read top to bottom, excepted), a docstring on every public function and method, and tests
named after the modules they test (tests/test_<pkg>_<mod>.py for raystudy/<pkg>/<mod>.py)."""

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


def _names_a_module(folder: Path, rest: str) -> bool:
    """Whether ``rest`` (a test file's name past ``test_<pkg>_``) is a module or package in ``folder``:
    ``stats_paired`` is stats/paired.py, ``stats`` the package, ``load_mlflow`` load.py on one aspect."""
    names = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    if rest in names:
        return True
    for name in names:
        if rest.startswith(name + "_"):
            sub = folder / name
            if not sub.is_dir() or _names_a_module(sub, rest[len(name) + 1 :]):
                return True
    return False


def _misnamed_tests(tests: list[str]) -> list[str]:
    """The tests/test_<pkg>_*.py files (pkg a folder of raystudy/, or analysis) that name no module
    (a command of analysis, ``analysis/commands/report.py``, goes by its own name: ``test_analysis_report``)."""
    roots = {p.name: p for p in (ROOT / "raystudy").iterdir() if (p / "__init__.py").exists()}
    roots["analysis"] = ROOT / "analysis"
    bad = []
    for name in tests:
        stem = name.removeprefix("test_").removesuffix(".py")
        for pkg, folder in roots.items():
            rest = stem[len(pkg) + 1 :]
            commands = folder / "commands"
            if stem.startswith(pkg + "_") and not (
                _names_a_module(folder, rest) or (commands.is_dir() and _names_a_module(commands, rest))
            ):
                bad.append(name)
    return bad


def test_each_package_test_names_a_module_that_exists():
    # a module renamed or moved leaves its test file's name pointing nowhere: caught here
    tests = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert not _misnamed_tests(tests), "\n".join(_misnamed_tests(tests))


def test_the_module_check_sees_what_it_should():
    names = [
        "test_models_registry.py",
        "test_analysis_stats.py",
        "test_analysis_stats_paired.py",
        "test_analysis_load_mlflow.py",
        "test_driver_tune_glue.py",
        "test_grid_ray.py",
        "test_e2e.py",
        "test_models_nothing.py",
        "test_analysis_stats_nothing.py",
        "test_analysis_mlflow.py",
    ]
    assert _misnamed_tests(names) == [
        "test_models_nothing.py",
        "test_analysis_stats_nothing.py",
        "test_analysis_mlflow.py",
    ]
