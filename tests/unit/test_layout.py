"""The package's layout is its architecture: edgetrain.controller runs where you type edgetrain,
edgetrain.rank (and the public API a script imports: callbacks, ddp, gpu, optimizers, tracing) inside a rank,
edgetrain.shared is what both use. Checked on every import a module holds, at its top or inside a
function (a lazy import runs all the same once its function does); only an import for type
checking (under ``if TYPE_CHECKING:``) never runs. The controller never loads rank code - nor
TensorFlow through it -, the shared part depends on neither side, and no modules import each
other round in a circle, not even for type checking (such a circle is two modules that cannot be
read apart)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "edgetrain"
RANK_SIDE = ("edgetrain.rank", "edgetrain.callbacks", "edgetrain.ddp", "edgetrain.gpu", "edgetrain.optimizers", "edgetrain.tracing")
FRAMEWORKS = ("tensorflow", "torch", "keras", "horovod", "mpi4py")
# What ``imported`` names for an import it cannot name: by a string computed at run time, or through
# the job registry (edgetrain.shared.jobs.JobSpec.load, which imports a job's module and TensorFlow).
BY_A_COMPUTED_NAME = "<an import by a computed name>"
THROUGH_THE_JOB_REGISTRY = "<a job's module, through JobSpec.load()>"
FORBIDDEN = {
    "controller": RANK_SIDE + FRAMEWORKS + (BY_A_COMPUTED_NAME, THROUGH_THE_JOB_REGISTRY),
    "shared": RANK_SIDE + ("edgetrain.controller",),
    "rank": ("edgetrain.controller",),
}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, (ast.Name, ast.Attribute)) and \
        (node.test.id if isinstance(node.test, ast.Name) else node.test.attr) == "TYPE_CHECKING"


def _walk(node: ast.AST, type_checking: bool = False):
    """Every node below ``node`` (ast.walk's), less the bodies of ``if TYPE_CHECKING:`` unless ``type_checking``."""
    for child in ast.iter_child_nodes(node):
        if _type_checking(child) and not type_checking:
            for kept in child.orelse:
                yield kept
                yield from _walk(kept)
            continue
        yield child
        yield from _walk(child, type_checking)


def _called(node: ast.Call) -> str | None:
    """The name a call is made by: ``f`` of ``f(..)`` and of ``a.b.f(..)``."""
    return node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else None


def imported(module: Path, type_checking: bool = False) -> set[str]:
    """Dotted names a module imports, wherever the import statement is (under ``if TYPE_CHECKING:``
    only where ``type_checking``); and those it imports by calling ``importlib.import_module`` or
    ``__import__`` (a name computed at run time: BY_A_COMPUTED_NAME), or a job spec's ``load()``
    (THROUGH_THE_JOB_REGISTRY)."""
    names = set()
    for node in _walk(ast.parse(module.read_text()), type_checking):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and _called(node) in ("import_module", "__import__"):
            first = node.args[0] if node.args else None
            names.add(first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else BY_A_COMPUTED_NAME)
        elif isinstance(node, ast.Call) and _called(node) == "load" and not node.args and not node.keywords:
            names.add(THROUGH_THE_JOB_REGISTRY)  # a file's or a stream's load takes what it reads
    return names


def module_names() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own, for its __init__)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Which of the package's modules each of them imports (``from a import b``: the module a.b
    where there is one, else a), for type checking too where ``type_checking``."""
    modules = module_names()
    return {name: {n for n in imported(path, type_checking) if n in modules} - {name} for name, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``graph`` (its first module again at its end), or None."""
    state: dict[str, str] = {}  # "open" while on the path being walked, then "done"
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_each_side_imports_only_what_its_place_allows():
    crossing = {}
    for side, forbidden in FORBIDDEN.items():
        for module in (PACKAGE / side).rglob("*.py"):
            bad = sorted(n for n in imported(module) if n.startswith(forbidden))
            if bad:
                crossing[str(module.relative_to(PACKAGE))] = bad
    assert crossing == {}


def test_no_modules_import_each_other_in_a_circle_not_even_for_type_checking():
    found = cycle(import_graph(type_checking=True))
    assert found is None, "import cycle (imports under TYPE_CHECKING included): " + " -> ".join(found)


def test_the_checks_see_an_import_inside_a_function_and_skip_one_for_type_checking(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import edgetrain.controller.launch\n"
                      "def f():\n    from edgetrain.rank import tf_ps\n")
    assert imported(module) == {"typing", "typing.TYPE_CHECKING", "edgetrain.rank", "edgetrain.rank.tf_ps"}
    assert imported(module, type_checking=True) == imported(module) | {"edgetrain.controller.launch"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_the_checks_see_an_import_made_by_a_string_or_through_the_job_registry(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import importlib\nfrom edgetrain.shared import jobs\n"
                      "def f(name):\n    importlib.import_module('tensorflow')\n    __import__('edgetrain.rank.worker')\n"
                      "    importlib.import_module(name)\n    jobs.get('lenet').load().model({})\n    json.load(open(name))\n")
    assert imported(module) == {"importlib", "edgetrain.shared", "edgetrain.shared.jobs", "tensorflow", "edgetrain.rank.worker",
                                BY_A_COMPUTED_NAME, THROUGH_THE_JOB_REGISTRY}
    assert all(n.startswith(FORBIDDEN["controller"]) for n in imported(module) - {"importlib", "edgetrain.shared", "edgetrain.shared.jobs"})
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_its_place():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "callbacks.py", "ddp.py", "gpu.py", "optimizers.py", "tracing.py"]
