"""What a run runs: a built-in job or the user's own script, with its arguments and the datasets it needs."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.shared import job_options, jobs
from edgetrain.shared.datasets import DATASETS, trained_on
from edgetrain.shared.errors import UsageError
from edgetrain.shared.job_options import JobOptions


@dataclass(frozen=True)
class Program:
    name: str  # the job's name, or the script's file name without .py: names the run
    args: tuple[str, ...]  # what the program is given
    job: jobs.JobSpec | None = None
    module: str | None = None  # what the worker runs for a built-in job or an edgetrain probe
    script: str | None = None  # relative to workdir
    workdir: Path | None = None
    datasets: tuple[str, ...] = ()  # required on every node
    epochs: int | None = None  # a built-in job's total, for resume checks
    requirements: Path | None = None  # extra Python packages the script needs
    checkpoint_options: dict = field(default_factory=dict)  # a built-in job's, as its checkpoints record them
    trained_with: dict = field(default_factory=dict)  # a built-in job's every option (job_options.as_run)

    def check_ranks(self, np: int) -> None:
        """What depends on the number of ranks: a built-in job's batch must fit in each rank's shard
        of what --holdout leaves for training."""
        if self.job is None:
            return
        batch = self.checkpoint_options["batch_size"]
        held = self.checkpoint_options.get("holdout")
        shard = trained_on(self.job.dataset, held) // np
        if batch > shard:
            of = f"{self.job.dataset} less --holdout {held}" if held else self.job.dataset
            raise UsageError(f"--batch-size {batch} is larger than each rank's shard of {of} ({shard} examples on {np} ranks)",
                             f"use --batch-size {shard} or less")

    @property
    def is_script(self) -> bool:
        return self.script is not None

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether a restart can resume it: a built-in job, or a script (or a module of its folder)
        that imports edgetrain's helpers, which checkpoint on rank 0 and restore on resume
        (edgetrain.callbacks, edgetrain.ddp)."""
        if not self.is_script:
            return self.job is not None
        assert self.workdir is not None and self.script is not None
        sources = [self.workdir / self.script, *(p for p in self.workdir.glob("*.py") if p.name != self.script)]
        return any(_imports_helpers(p) for p in sources)

    def worker_args(self) -> list[str]:
        """The program part of ``edgetrain.rank.worker``'s command line."""
        if self.module is not None:
            return ["--module", "--quiet", self.module, "--", *self.args]
        return [self.script or "", "--", *self.args]


HELPERS = ("edgetrain.callbacks", "edgetrain.ddp")


def _imports_helpers(source: Path) -> bool:
    try:
        tree = ast.parse(source.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name in HELPERS for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module is not None and (
                node.module in HELPERS or (node.module == "edgetrain" and any(f"edgetrain.{a.name}" in HELPERS for a in node.names))):
            return True
    return False


def parse_options(given: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs from ``-o``; their names and types are the job's to check."""
    found = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"-o {item!r} is not NAME=VALUE", "e.g. -o width=8")
        found[name.strip()] = value.strip()
    return found


def _builtin(spec: jobs.JobSpec, o: JobOptions, passthrough: list[str]) -> Program:
    if passthrough:
        raise UsageError(f"the built-in job {spec.name} takes no arguments after --: {' '.join(passthrough)}",
                         f"use its options (edgetrain run {spec.name} --help)")
    unknown = sorted(set(o.extra) - set(spec.options))
    if unknown:
        known = ", ".join(f"{k}={v}" for k, v in spec.options.items()) or "none"
        raise UsageError(f"job {spec.name} has no option {unknown[0]}", f"its own options (with their defaults): {known}")
    o.check()
    options = dict(spec.options)
    for name, value in o.extra.items():
        # A job declares each option by its default, whose type the given value must have.
        try:
            options[name] = type(spec.options[name])(value)
        except ValueError:
            kind = {int: "a whole number", float: "a number"}.get(type(spec.options[name]), type(spec.options[name]).__name__)
            raise UsageError(f"-o {name}={value}: {name} takes {kind}",
                             f"e.g. -o {name}={spec.options[name]}") from None
        if isinstance(options[name], int) and options[name] < 1:
            raise UsageError(f"-o {name}={value} must be at least 1")
    values = {**o.__dict__, "epochs": o.epochs or spec.epochs, "batch_size": o.batch_size or spec.batch_size}
    epochs = values["epochs"]
    args = ["--job", spec.name, "--options", json.dumps(options), *job_options.argv(values)]
    checkpoint_options = job_options.recorded(values, options)
    return Program(spec.name, tuple(args), job=spec, module="edgetrain.rank.training", datasets=(spec.dataset,), epochs=epochs,
                   checkpoint_options=checkpoint_options, trained_with=job_options.as_run(values, options))


def resolve(target: str, passthrough: list[str], options: JobOptions, workdir: Path | None = None,
            wanted: list[str] | None = None, requirements: Path | None = None) -> Program:
    """``edgetrain run TARGET``: a built-in job's name, or the path of a Python script."""
    if target in jobs.JOBS:
        if workdir is not None or requirements is not None:
            raise UsageError(f"--{'workdir' if workdir is not None else 'requirements'} is for scripts; "
                             f"the built-in job {target} needs nothing beyond the image")
        return _builtin(jobs.JOBS[target], options, passthrough)
    path = Path(target)
    if not path.exists():
        if path.suffix == ".py" or "/" in target:
            raise UsageError(f"script {target} does not exist", "give the path of your training script")
        raise UsageError(f"unknown job {target!r}", f"choose one of: {', '.join(jobs.JOBS)}, or give the path of your script")
    if not path.is_file():
        raise UsageError(f"{target} is not a file", "give the path of your training script (e.g. ./train.py)")
    given = options.given()
    if given:
        raise UsageError(f"{given[0]} is an option of the built-in jobs, not of your script",
                         f"pass your script's own options after --: edgetrain run {target} -- {given[0]} ...")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(f"{target} line {exc.lineno}: {exc.msg}", "fix the script; nothing was started") from None
    except ValueError as exc:  # null bytes: not a Python source file
        raise UsageError(f"{target} is not a Python script ({exc})") from None
    root = (workdir or path.parent).resolve()
    script = path.resolve()
    if not script.is_relative_to(root):
        raise UsageError(f"script {target} is not inside --workdir {root}", "pass the folder that holds the script")
    for name in wanted or []:
        if name not in DATASETS:
            raise UsageError(f"unknown --dataset {name!r}", f"use one of: {', '.join(DATASETS)}")
    name = script.stem if script.stem not in ("train", "main") else f"{root.name}-{script.stem}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "script"
    if requirements is not None and not requirements.is_file():
        raise UsageError(f"--requirements {requirements} is not a file")
    beside = script.parent / "requirements.txt"
    return Program(name, tuple(passthrough), script=script.relative_to(root).as_posix(), workdir=root,
                   datasets=tuple(wanted or ()), requirements=requirements or (beside if beside.is_file() else None))
