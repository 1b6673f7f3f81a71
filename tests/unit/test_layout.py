"""The package's layout is its architecture: edgetrain.controller runs where you type edgetrain,
edgetrain.rank (and the public API a script imports: callbacks, ddp, gpu, optimizers, tracing) inside a rank,
edgetrain.shared is what both use. Checked on every import a module holds, at its top or inside a
function (a lazy import runs all the same once its function does); only an import for type
checking (under ``if TYPE_CHECKING:``) never runs. The controller never loads rank code - nor
TensorFlow through it -, the shared part depends on neither side, and no modules import each
other round in a circle, not even for type checking (such a circle is two modules that cannot be
read apart). And one module, edgetrain.shared.layout, spells the names in a run directory: no
other in edgetrain/ or lab/ does. No function or method there spans more than 70 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from edgetrain.controller.containers import RUN_MOUNT
from edgetrain.shared.layout import RankFile, RunLayout

PACKAGE = Path(__file__).resolve().parents[2] / "edgetrain"
LAB = PACKAGE.parent / "lab"
LAYOUT = PACKAGE / "shared" / "layout.py"
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


LONGEST = 70  # lines, from a function's def to its last line (its decorators left out)


def long_functions(root: Path, limit: int = LONGEST) -> list[str]:
    """Every function and method in the modules under ``root`` (nested ones too) longer than
    ``limit`` lines, as path:line name (N lines), the path from ``root``'s parent."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (lines := node.end_lineno - node.lineno + 1) > limit:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_70_lines():
    found = [f for root in (PACKAGE, LAB) for f in long_functions(root)]
    assert found == [], f"over {LONGEST} lines, split into functions of one job each:\n" + "\n".join(found)


def test_the_length_check_names_a_long_function_or_method_and_spares_one_of_70_lines(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"        x = {i}\n" for i in range(69))
    (package / "m.py").write_text("def seventy():\n" + body + "\n\nclass C:\n    @property\n    def long(self):\n" + body + body)
    (package / "n.py").write_text("import os\n\n\nasync def seventy_one():\n" + body + "        x = 69\n")
    assert long_functions(package) == ["pkg/m.py:75 long (139 lines)", "pkg/n.py:4 seventy_one (71 lines)"]


def test_every_module_has_its_place():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "callbacks.py", "ddp.py", "gpu.py", "optimizers.py", "tracing.py"]


# Every name in a run directory, as RunLayout declares them: its upper-case class attributes, the
# start of every rank file's name ("rank.", not after a dot: edgetrain.rank.lease is a module), and
# a kind with a dot ("failure.json", which a rank file's temporary name holds after a dot).
RANK_PREFIX = RunLayout.RANK_FILE.split("{")[0]
NAMES = sorted({v for k, v in vars(RunLayout).items() if k.isupper() and isinstance(v, str) and "{" not in v}
               | {RANK_PREFIX} | {k.value for k in RankFile if "." in k.value})
# A name with a dot is a file's name whatever text holds it, a message's included; one without
# counts as a directory of a path ("checkpoints", "x/checkpoints/", "work/"). Of those, a name that
# is also a record's field or a command's counts only where a "/" makes the text a path.
DOTTED = [n for n in NAMES if "." in n and n != RANK_PREFIX]
DIRS = [n for n in NAMES if "." not in n]
FIELDS = ("ranks", "data", "outputs")


def _spelled(text: str, absolute_ok: bool) -> list[str]:
    """The run-directory names ``text`` spells. A whole absolute path (``absolute_ok``) is outside
    every run directory - a run directory is reached from a root the code is given - except under
    a container's mount of one."""
    if absolute_ok and text.startswith("/") and not text.startswith(RUN_MOUNT):
        return []
    found = [n for n in DOTTED if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
    found += [RANK_PREFIX] if re.search(rf"(?<![\w.-]){re.escape(RANK_PREFIX)}", text) else []
    parts = text.split("/")
    return found + [n for n in DIRS if n in parts and (len(parts) > 1 or n not in FIELDS)]


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def spelled_names(module: Path) -> list[tuple[int, str, str]]:
    """(line, text, name) for each string literal of ``module`` that spells a run-directory name;
    docstrings, prose for readers, are left out. A piece of an f-string is a path's piece, never
    a whole absolute path."""
    tree = ast.parse(module.read_text())
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    skipped = _docstrings(tree)
    return sorted((node.lineno, node.value, name) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
                  for name in _spelled(node.value, absolute_ok=id(node) not in pieces))


def test_only_the_layout_module_spells_a_run_directorys_names():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r} spells {name!r}"
             for root in (PACKAGE, LAB) for path in sorted(root.rglob("*.py")) if path != LAYOUT
             for line, text, name in spelled_names(path)]
    assert found == [], "use edgetrain.shared.layout.RunLayout:\n" + "\n".join(found)


def test_the_names_check_sees_paths_messages_and_pieces_of_f_strings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('''"""Writes run.json and checkpoints/."""
import os
a = run_dir / "checkpoints"
b = f"{node_dir}/checkpoints/{epoch}"
c = f"rank.{rank}.log"
d = "no readable run.json (damaged)"
e = ["metrics.jsonl", "rank.*.failure.json", "work"]
f = f"{d}/.lease/renewed"
g = {"ranks": 2, "outputs": [], "data": "x", "ended": None}
h = ("edgetrain.rank.lease", "/etc/edgetrain/machinefile", "/edgetrain/data", "checkpoints 1 verified", "bench.json")
i = "/edgetrain/run/.lock"
j = os.path.join(x, "ranks/3")
''')
    assert sorted((line, name) for line, _, name in spelled_names(module)) == [
        (3, "checkpoints"), (4, "checkpoints"), (5, "rank."), (6, "run.json"), (7, "failure.json"), (7, "metrics.jsonl"),
        (7, "rank."), (7, "work"), (8, ".lease"), (8, "renewed"), (11, ".lock"), (12, "ranks")]
    assert {"run.json", "metrics.jsonl", "checkpoints", "work", "outputs", "outputs.json", "workdir.json", ".lease",
            "failure.json", "rank."} <= set(NAMES)


def test_the_layout_keeps_the_names_kept_run_directories_hold():
    """Renaming one would orphan every run directory written before: their names, spelled out."""
    here, node = RunLayout(Path("r")), RunLayout.posix("/home/pi/runs/r/")
    assert [str(p) for p in (here.info_file, here.metrics_file, here.checkpoints, here.machinefile, here.lock_file,
                             here.workdir_manifest, here.outputs_list, here.tensorboard, here.data, here.work(), here.outputs(),
                             here.work(3), here.outputs(3), here.log(2), here.rank_file(2, RankFile.FAILURE),
                             here.rank_file(2, RankFile.ENDED))] == [
        "r/run.json", "r/metrics.jsonl", "r/checkpoints", "r/machinefile", "r/.lock", "r/workdir.json", "r/outputs.json",
        "r/tensorboard", "r/data", "r/work", "r/outputs", "r/ranks/3/work", "r/ranks/3/outputs", "r/rank.2.log",
        "r/rank.2.failure.json", "r/rank.2.ended"]
    assert (str(node.lease_dir), str(node.lease)) == ("/home/pi/runs/r/.lease", "/home/pi/runs/r/.lease/renewed")
    assert [RunLayout.rank_of(n, RankFile.LOG) for n in ("rank.0.log", "rank.12.log", "rank.01.log", "rank.x.log", "rank.1.ended")] == \
        [0, 12, None, None, None]
