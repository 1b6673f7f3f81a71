"""What a run runs: a built-in job or the user's own script, with its arguments and the datasets it needs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import jobs
from .datasets import DATASETS, TRAIN_EXAMPLES
from .errors import UsageError
from .learning_rate import WARMUP_EPOCHS

@dataclass(frozen=True)
class JobOptions:
    """The built-in jobs' options; a user script takes its own after ``--``."""

    epochs: int | None = None
    batch_size: int | None = None
    max_steps: int | None = None
    seed: int = 42
    target_accuracy: float | None = None
    warmup_epochs: float = WARMUP_EPOCHS
    extra: dict = field(default_factory=dict)  # the job's own, as declared in its JobSpec (``-o width=8``)
    eval_every: int | None = None
    eval_examples: int | None = None
    fp16_allreduce: bool = False
    backward_passes_per_step: int = 1
    steps_per_execution: int = 8
    lr_scaling: float = 1.0
    tf_threads: int | None = None  # TensorFlow's intra-op threads per rank (default: the node's cores per rank)

    def given(self) -> list[str]:
        """The options that differ from their defaults, as the user would have typed them."""
        found = [f"--{k.replace('_', '-')}" for k, v in self.__dict__.items()
                 if k != "extra" and v != JobOptions.__dataclass_fields__[k].default]
        return found + [f"-o {k}=..." for k in self.extra]


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

    def check_ranks(self, np: int) -> None:
        """What depends on the number of ranks: a built-in job's batch must fit in each rank's shard."""
        if self.job is None:
            return
        batch = self.checkpoint_options["batch_size"]
        shard = TRAIN_EXAMPLES[self.job.dataset] // np
        if batch > shard:
            raise UsageError(f"--batch-size {batch} is larger than each rank's shard of {self.job.dataset} ({shard} examples on {np} ranks)",
                             f"use --batch-size {shard} or less")

    @property
    def is_script(self) -> bool:
        return self.script is not None

    def worker_args(self) -> list[str]:
        """The program part of ``edgetrain.worker``'s command line."""
        if self.module is not None:
            return ["--module", "--quiet", self.module, "--", *self.args]
        return [self.script or "", "--", *self.args]


def parse_options(given: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs from ``-o``; their names and types are the job's to check."""
    found = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"-o {item!r} is not NAME=VALUE", "e.g. -o width=8")
        found[name.strip()] = value.strip()
    return found


def _check_numbers(o: JobOptions) -> None:
    for name, value in (("--epochs", o.epochs), ("--batch-size", o.batch_size), ("--max-steps", o.max_steps),
                        ("--eval-every", o.eval_every), ("--eval-examples", o.eval_examples),
                        ("--backward-passes-per-step", o.backward_passes_per_step),
                        ("--steps-per-execution", o.steps_per_execution), ("--tf-threads", o.tf_threads)):
        if value is not None and value < 1:
            raise UsageError(f"{name} {value} must be at least 1")
    if not o.warmup_epochs >= 0:  # also refuses nan
        raise UsageError(f"--warmup-epochs {o.warmup_epochs} must be a number of epochs, 0 or more", "use 0 for no warmup")
    if not 0 <= o.lr_scaling <= 1:
        raise UsageError(f"--lr-scaling {o.lr_scaling} must be a power between 0 and 1", "1 scales linearly, 0.5 as the square root")
    if o.target_accuracy is not None and not 0 < o.target_accuracy <= 1:
        raise UsageError(f"--target-accuracy {o.target_accuracy} must be a fraction in (0, 1]", "e.g. --target-accuracy 0.97")
    if o.seed < 0:
        raise UsageError(f"--seed {o.seed} must be 0 or more")


def _builtin(spec: jobs.JobSpec, o: JobOptions, passthrough: list[str]) -> Program:
    if passthrough:
        raise UsageError(f"the built-in job {spec.name} takes no arguments after --: {' '.join(passthrough)}",
                         f"use its options (edgetrain run {spec.name} --help)")
    unknown = sorted(set(o.extra) - set(spec.options))
    if unknown:
        known = ", ".join(f"{k}={v}" for k, v in spec.options.items()) or "none"
        raise UsageError(f"job {spec.name} has no option {unknown[0]}", f"its own options (with their defaults): {known}")
    _check_numbers(o)
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
    epochs = o.epochs or spec.epochs
    args = ["--job", spec.name, "--epochs", str(epochs), "--batch-size", str(o.batch_size or spec.batch_size),
            "--seed", str(o.seed), "--warmup-epochs", str(o.warmup_epochs), "--options", json.dumps(options)]
    if o.lr_scaling != 1:  # only when set: an image built before the option still runs the rest
        args += ["--lr-scaling", str(o.lr_scaling)]
    if o.max_steps:
        args += ["--max-steps", str(o.max_steps)]
    if o.tf_threads:
        args += ["--tf-threads", str(o.tf_threads)]
    if o.target_accuracy is not None:
        args += ["--target-accuracy", str(o.target_accuracy)]
    if o.eval_every:
        args += ["--eval-every", str(o.eval_every)]
    if o.eval_examples:
        args += ["--eval-examples", str(o.eval_examples)]
    # As edgetrain.training records them in its checkpoints: the tuning options only when set.
    checkpoint_options = {"batch_size": o.batch_size or spec.batch_size, **options}
    if o.fp16_allreduce:
        args.append("--fp16-allreduce")
        checkpoint_options["fp16_allreduce"] = True
    args += ["--steps-per-execution", str(o.steps_per_execution)]
    if o.backward_passes_per_step != 1:
        args += ["--backward-passes-per-step", str(o.backward_passes_per_step)]
        checkpoint_options["backward_passes_per_step"] = o.backward_passes_per_step
    return Program(spec.name, tuple(args), job=spec, module="edgetrain.training", datasets=(spec.dataset,), epochs=epochs,
                   checkpoint_options=checkpoint_options)


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
