"""Figures of runs and benches, drawn with matplotlib into SVG files (no display needed).

A bench figure sets one or more benches side by side - the same job under two emulation brackets,
or on two clusters - each median with its tries' spread as error bars; a run figure sets one or
more runs' accuracy and img/s over their time.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from edgetrain.controller.bench.model import SyncCandidate
from edgetrain.controller.bench.record import BENCH, BenchRecord, read
from edgetrain.shared import runs
from edgetrain.shared.errors import EdgetrainError, UsageError

def draw(root: Path, ids: list[str], out: Path | None = None, labels: list[str] | None = None) -> Path:
    """One figure of the runs, or of the benches, ``ids`` names (ids or unique prefixes in ``root``):
    into ``out``, by default ``plot.svg`` in the one's directory."""
    if not ids:
        raise UsageError("name a run or bench to plot", "see them with: edgetrain runs list, or ls the runs directory")
    if labels and len(labels) != len(ids):
        raise UsageError(f"{len(labels)} --label for {len(ids)} ids", "give one --label per id, in the same order, or none")
    if out is None and len(ids) > 1:
        raise UsageError("several ids make one figure: say where it goes", "add --out FILE.svg")
    found = [runs.find_dir(root, i, (runs.Run.RECORD, BENCH)) for i in ids]
    benches = [d for d in found if (d / BENCH).is_file()]
    if benches and len(benches) != len(found):
        raise UsageError("a figure is of runs or of benches, not both", "plot the benches and the runs apart")
    out = out or found[0] / "plot.svg"
    if out.suffix.lower().lstrip(".") not in FORMATS:
        raise UsageError(f"{out}: a plot is written as {', '.join('.' + f for f in FORMATS)}", f"name the file {out.with_suffix('.svg').name}")
    if not benches:
        return save(run_figure([runs.Run(d) for d in found], labels), out)
    read_back = []
    for d in found:
        try:
            read_back.append(read(d / BENCH))
        except (OSError, ValueError) as exc:
            raise EdgetrainError(f"{d / BENCH} cannot be read: {exc}", "the bench was cut short or the file was damaged") from None
    return save(bench_figure(list(zip(labels or [d.name for d in found], read_back, strict=True))), out)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plots need matplotlib, which this Python environment lacks",
                             "pip install 'edgetrain[plot]' (scripts/setup installs it)") from None
    matplotlib.use("Agg")  # files only: a controller may have no display
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text (searchable), not glyph outlines
    import matplotlib.pyplot as plt

    return plt


def _spread(values: list[float], middle: float) -> tuple[float, float]:
    """How far below and above the median the tries went (error bars)."""
    return (middle - min(values), max(values) - middle) if values else (0.0, 0.0)


def _sync_name(k: int, mode: str) -> str:
    return f"--sync-every {k} {mode}"


def _syncs(bench: BenchRecord) -> tuple[str, dict[str, list[SyncCandidate]]]:
    """The N-loop's own --sync-every setting's legend name, and the measured candidates other than it
    by theirs, each in N order."""
    own = _sync_name(bench.sync_every, bench.sync_mode.value)
    found: dict[str, list[SyncCandidate]] = {}
    for c in sorted(bench.sync_candidates, key=lambda c: c.nodes):
        name = _sync_name(c.sync_every, c.sync_mode)
        if c.images_per_sec and name != own:
            found.setdefault(name, []).append(c)
    return own, found


def bench_figure(benches: list[tuple[str, BenchRecord]]):
    """img/s against N (median of the tries, their range as error bars, the ideal N x R(1) dashed),
    E(N) measured and predicted (the band from nothing to all of the allreduce hidden, shaded), and
    the seconds to the target accuracy - one series per (label, bench), and one more per
    --sync-every candidate the bench measured besides its own setting."""
    plt = _pyplot()
    fig, (rate, eff, target) = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
    goals = set()
    colours = (f"C{i}" for i in itertools.count())
    for bench_label, bench in benches:
        colour = next(colours)
        own, others = _syncs(bench)
        label = f"{bench_label}: {own}" if others else bench_label
        points = [p for p in bench.points or () if p.images_per_sec]
        for ax, key in ((rate, "images_per_sec"), (target, "seconds_to_target")):
            shown = [p for p in points if getattr(p, key) is not None]
            tries = [[getattr(t, key) for t in p.trials if getattr(t, key) is not None] for p in shown]
            bars = list(zip(*(_spread(v, getattr(p, key)) for v, p in zip(tries, shown, strict=True)), strict=True)) or None
            ax.errorbar([p.nodes for p in shown], [getattr(p, key) for p in shown], yerr=bars, color=colour, marker="o",
                        capsize=3, label=label)
        # N x the one-node rate E(N) divides by (concurrent references: N's own; else N = 1's).
        one = next((p.images_per_sec for p in points if p.nodes == 1), None)
        refs = {p.nodes: p.reference or one for p in points}
        ideal = [(n, n * ref) for n, ref in refs.items() if ref]
        if ideal:
            rate.plot(*zip(*ideal, strict=True), color=colour, linestyle=":", alpha=0.6, label=f"{label}: N x one node")
        eff.plot([p.nodes for p in points if p.efficiency is not None],
                 [p.efficiency for p in points if p.efficiency is not None], color=colour, marker="o", label=f"{label}: measured")
        predicted = sorted((n, e) for n, e in bench.predicted_efficiency.items() if e is not None)
        if predicted:
            eff.plot([n for n, _ in predicted], [e for _, e in predicted], color=colour, linestyle="--", marker="x",
                     label=f"{label}: predicted")
            band = sorted((n, lo, hi) for n, (lo, hi) in bench.predicted_range.items())
            if band:
                eff.fill_between([n for n, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band], color=colour, alpha=0.12)
        for name, found in others.items():
            colour, name = next(colours), f"{bench_label}: {name}"
            for ax, key in ((rate, "images_per_sec"), (target, "seconds_to_target")):
                tried = [c for c in found if getattr(c, key) is not None]
                ax.plot([c.nodes for c in tried], [getattr(c, key) for c in tried], color=colour, marker="s", label=name)
            measured = [(c.nodes, c.images_per_sec / (c.nodes * ref)) for c in found if c.images_per_sec and (ref := refs.get(c.nodes))]
            if measured:
                eff.plot(*zip(*measured, strict=True), color=colour, marker="s", label=f"{name}: measured")
            expected = [(c.nodes, c.predicted) for c in found]
            if expected:
                eff.plot(*zip(*expected, strict=True), color=colour, linestyle="--", marker="x", label=f"{name}: predicted")
        if bench.target_accuracy:
            goals.add(bench.target_accuracy)
    rate.set(title="img/s (median; bars: the tries' range)", xlabel="nodes N", ylabel="images / s")
    eff.set(title="E(N) = R(N) / (N R(1))", xlabel="nodes N")
    eff.axhline(1.0, color="grey", linewidth=0.8)
    target.set(title="seconds to " + (", ".join(f"{g:.1%}" for g in sorted(goals)) if goals else "the target") + " val accuracy",
               xlabel="nodes N", ylabel="s from the first step")
    for ax in (rate, eff, target):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    return fig


def run_figure(chosen: list[runs.Run], labels: list[str] | None = None):
    """Accuracy (each epoch's, and the evaluations between) and img/s of each run over its time,
    in seconds from its first step (epochs: from its start)."""
    plt = _pyplot()
    fig, (acc, rate) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for i, (run, name) in enumerate(zip(chosen, labels or [r.id for r in chosen], strict=True)):
        colour, metrics = f"C{i}", [m for m in run.metrics() if isinstance(m.get("elapsed"), (int, float))]
        evals = [e for e in run.evaluations() if isinstance(e.get("seconds"), (int, float))]
        if evals:
            acc.plot([e["seconds"] for e in evals], [e["val_accuracy"] for e in evals], color=colour, marker=".", label=f"{name}: evaluations")
        for key, style in (("val_accuracy", "o"), ("accuracy", "s")):
            shown = [m for m in metrics if isinstance(m.get(key), (int, float))]
            if shown:
                acc.plot([m["elapsed"] for m in shown], [m[key] for m in shown], color=colour, marker=style, linestyle="--" if key == "accuracy" else "-",
                         alpha=1.0 if key == "val_accuracy" else 0.5, label=f"{name}: {key} per epoch")
        shown = [m for m in metrics if isinstance(m.get("images_per_sec"), (int, float))]
        if shown:
            rate.plot([m["elapsed"] for m in shown], [m["images_per_sec"] for m in shown], color=colour, marker="o", label=name)
    if not (acc.has_data() or rate.has_data()):
        plt.close(fig)
        raise EdgetrainError(f"{', '.join(r.id for r in chosen)}: no epoch or evaluation records to plot ({runs.Run.METRICS})",
                             "a script records them with edgetrain.callbacks.Progress or edgetrain.ddp.Progress")
    acc.set(title="accuracy", xlabel="seconds", ylabel="accuracy")
    rate.set(title="img/s per epoch", xlabel="seconds from the start", ylabel="images / s")
    for ax in (acc, rate):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    return fig


# What the file's suffix may ask for: SVG stays text (diffable, searchable), the others for slides.
FORMATS = ("svg", "png", "pdf")


def save(fig, path: Path) -> Path:
    """Write the figure in the format its suffix names and let it go."""
    plt = _pyplot()
    try:
        fig.savefig(path, format=path.suffix.lower().lstrip("."))
    except OSError as exc:
        raise EdgetrainError(f"could not write the plot {path}: {exc.strerror or exc}", "check the directory and its free space") from None
    finally:
        plt.close(fig)
    return path
