"""The import graph stays layered: no circle, no import up a layer, no CLI reaching into another.

Every import counts, including those inside functions (a lazy import up a layer is still a
dependency up a layer). Layers, lowest first; a module may import its own layer or lower ones.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("raystudy", "analysis")

# Layers, lowest first, each a package (every module under it) or a module. A module may import its
# own layer or lower ones; the analysis library sits above the whole of raystudy's library (which
# imports no analysis), and the command lines above both.
LAYERS = [
    # leaves: errors, paths, the bounds every layer checks, the packages themselves (analysis holds AnalysisError)
    ["raystudy", "raystudy.errors", "raystudy.paths", "raystudy.bounds", "analysis"],
    # what a model is: its family, its weights, its components over the parameter names
    ["raystudy.models"],
    # what a model trains and is tested on: the registry, your own data, batches, augmentation
    ["raystudy.data"],
    # what is measured on a model: plasticity and its bounds, a trial's GPU cost
    ["raystudy.measure"],
    # one trial: its config, the loop, the Tune trainable, weights raystudy builds itself
    ["raystudy.train"],
    # the study's plan: space files, grids, searches, the adaptive policy (no Ray, no MLflow)
    ["raystudy.spaces"],
    # the MLflow record: the store, the runs written, read back and shown
    ["raystudy.tracking"],
    # the driver (Ray + driver-side MLflow) and its console
    ["raystudy.driver"],
    # the analysis's pure statistics
    ["analysis.stats"],
    # the analysis library: load, tables, figures, intervals, the study, best configs, the replay
    ["analysis"],
    # the report's sections, each a function of the study
    ["analysis.sections"],
    # the report: every section into one folder (and MLflow)
    ["analysis.reporting"],
    # command lines: argument parsing and one call into the layers below (cli: the flag toolkit they
    # share); raystudy.grid keeps `python -m raystudy.grid`
    ["raystudy.commands", "analysis.commands", "raystudy.grid"],
    # the `raystudy` command: dispatches to the command lines by name, importing one when named
    ["raystudy.__main__"],
]


def layer_of(module: str) -> int:
    """The layer of the longest name in ``LAYERS`` that is ``module`` or a package holding it."""
    if module in LAYERS[0]:
        return 0
    found = [
        (len(n), i) for i, layer in enumerate(LAYERS[1:], 1) for n in layer if module == n or module.startswith(n + ".")
    ]
    return max(found)[1] if found else -1


COMMANDS = len(LAYERS) - 2  # the command lines' layer
# In it but no command line: the packages, the flag toolkit, the shim of `python -m raystudy.grid`;
# and any module there without a ``main`` (what a command prints: ``grid_text``, ``search_text``).
NOT_COMMANDS = {"raystudy.commands", "analysis.commands", "raystudy.commands.cli", "raystudy.grid"}


def is_command(module: str) -> bool:
    """Whether ``module`` is a command line (a ``main`` a subcommand runs)."""
    if layer_of(module) != COMMANDS or module in NOT_COMMANDS or module not in modules():
        return False
    tree = ast.parse(modules()[module].read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def modules() -> dict[str, Path]:
    """Every module of the packages, subpackages included (``raystudy.driver.lock``), by dotted name."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(path: Path) -> list[tuple[str, str]]:
    """(module imported, name imported or '') of every project import in ``path``, any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((sub, "") if sub in modules() else (node.module, a.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] in PACKAGES]
    return found


def graph() -> dict[str, set[str]]:
    return {m: {dep for dep, _ in imports(p) if dep != m} for m, p in modules().items()}


def test_every_module_has_a_layer():
    assert not [m for m in modules() if layer_of(m) < 0], [m for m in modules() if layer_of(m) < 0]
    assert {n for layer in LAYERS for n in layer} <= set(modules())


def test_no_import_goes_up_a_layer():
    up = [
        f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
        for m, deps in graph().items()
        for d in deps
        if layer_of(d) > layer_of(m)
    ]
    assert not up, "\n".join(up)


def test_no_import_circle():
    g = graph()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(d) :] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_no_private_names_across_modules_and_no_cli_imports_another():
    bad = []
    for m, p in modules().items():
        for dep, name in imports(p):
            if name.startswith("_") and dep != m:
                bad.append(f"{m} imports private {dep}.{name}")
            if is_command(m) and is_command(dep) and dep != m:
                bad.append(f"command line {m} imports command line {dep}")
    assert not bad, "\n".join(bad)


def test_no_import_goes_up_between_the_packages():
    # raystudy's library is below the analysis (which reads its runs, spaces and configs); only a
    # command line, above both, imports the two. Inside the analysis, the study and the library
    # are below the report's sections, and the sections below the report that assembles them.
    up = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        for d in deps
        if (m.startswith("raystudy.") and layer_of(m) < COMMANDS and d.split(".")[0] == "analysis")
        or (
            layer_of(m) < layer_of("analysis.sections.trust")
            and d.startswith(("analysis.sections", "analysis.reporting"))
        )
        or (layer_of(m) < COMMANDS and d.startswith(("raystudy.commands", "analysis.commands", "raystudy.grid")))
    ]
    assert not up, "\n".join(up)


def test_spaces_know_nothing_of_ray_or_mlflow():
    code = (
        "import sys; from raystudy.spaces import grids, searches; grids.expand(grids.load_grid('paper'), 'vit_base'); "
        "searches.load_search('optimiser'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'optuna')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_importing_every_module_starts_nothing():
    code = (
        "import sys\n" + "".join(f"import {m}\n" for m in modules()) + "import ray, torch\n"
        "assert not ray.is_initialized()\n"
        "assert 'MLFLOW_TRACKING_URI' not in __import__('os').environ\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_analysis_and_the_registries_load_without_torch():
    code = (
        "import sys, analysis.commands.report, analysis.commands.export, analysis.reporting; "
        "import raystudy.models.components, raystudy.models.registry; "
        "analysis.reporting.paper_order(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_driver_loads_no_torch(demo_weights):  # the file built: checking it is what every CLI does
    # The driver validates every trial's config (so do --dry-run and the bad-input checks) and
    # hands Tune the trainable: torch's import is seconds of CPU there, and only the trials use it.
    code = (
        "import sys; from raystudy.commands import search\n"
        "from raystudy.data.registry import check_dataset\n"
        "from raystudy.spaces import grids\n"
        "from raystudy.train import pretrain\n"
        "from raystudy.driver import grid_run, optuna_search, session\n"
        "trials = grids.expand(grids.load_grid('demo'), 'vit_demo', None, None, None, {})\n"
        "assert pretrain.ensure_weights('vit_demo', log=None).is_file()\n"
        "assert len({t.config['dataset'] for t in trials}) > 1 and check_dataset('cifar10')\n"
        "assert len(grids.expand(grids.load_grid('paper'), 'vit_huge')) > 100\n"  # a hub model's grid
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]


def test_no_library_module_holds_a_command_line():
    # A command line is argument parsing and one call: a parser or a `main` below the command
    # lines would be a second home for what a command does.
    bad = []
    for m, p in modules().items():
        if layer_of(m) >= COMMANDS or m == "raystudy.errors":
            continue
        tree = ast.parse(p.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in ("main", "build_parser"):
                bad.append(f"{m} defines {node.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name in ("ArgumentParser", "Parser", "OneLineParser"):
                    bad.append(f"{m} builds an argument parser ({name})")
    assert not bad, "\n".join(bad)
