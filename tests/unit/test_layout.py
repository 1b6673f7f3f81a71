"""The package's layout is its architecture: edgetrain.controller runs where you type edgetrain,
edgetrain.rank (and the public API a script imports: callbacks, ddp, gpu, optimizers, tracing) inside a rank,
edgetrain.shared is what both use. Checked on every module's import-time imports (a lazy import
inside a rank-only method of a shared strategy runs in a rank, and an import for type checking
never runs): the controller never loads rank code - nor TensorFlow through it - and the shared
part depends on neither side."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "edgetrain"
RANK_SIDE = ("edgetrain.rank", "edgetrain.callbacks", "edgetrain.ddp", "edgetrain.gpu", "edgetrain.optimizers", "edgetrain.tracing")
FORBIDDEN = {
    "controller": RANK_SIDE,
    "shared": RANK_SIDE + ("edgetrain.controller",),
    "rank": ("edgetrain.controller",),
}


def imported(module: Path) -> set[str]:
    """Dotted names a module imports when it is imported (top-level statements only)."""
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_each_side_imports_only_what_its_place_allows():
    crossing = {}
    for side, forbidden in FORBIDDEN.items():
        for module in (PACKAGE / side).rglob("*.py"):
            bad = sorted(n for n in imported(module) if n.startswith(forbidden))
            if bad:
                crossing[str(module.relative_to(PACKAGE))] = bad
    assert crossing == {}


def test_every_module_has_its_place():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "callbacks.py", "ddp.py", "gpu.py", "optimizers.py", "tracing.py"]
