"""The built-in jobs' options, each declared once, as a field of the frozen ``JobOptions``: name,
type and default, and in the field's metadata its help, check, and whether a checkpoint records it.
``OPTIONS`` lists them (``JobOption``), and everything else is derived from it: the ``run`` and
``bench`` commands' options (``with_job_options``), the checks, the worker's command line for
``edgetrain.rank.training`` (``argv``), its argument parser (``add_arguments``) and what a resume
must repeat (``recorded``). A user script takes its own options after ``--``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from edgetrain.shared.datasets import HOLDOUT_SPLIT, TRAIN_EXAMPLES, TUNED_SPLIT
from edgetrain.shared.errors import UsageError
from edgetrain.shared.learning_rate import WARMUP_EPOCHS
from edgetrain.shared import sync

# The problem with a value, and how to fix it; None: the value is fine.
Check = Callable[[Any], "tuple[str, str | None] | None"]


def at_least(low: int) -> Check:
    words = "at least 1" if low == 1 else f"{low} or more"
    return lambda v: (f"must be {words}", None) if v < low else None


def _warmup(v: float) -> tuple[str, str] | None:
    return None if v >= 0 else ("must be a number of epochs, 0 or more", "use 0 for no warmup")  # also refuses nan


def _power(v: float) -> tuple[str, str] | None:
    return None if 0 <= v <= 1 else ("must be a power between 0 and 1", "1 scales linearly, 0.5 as the square root")


def _fraction(v: float) -> tuple[str, str] | None:
    return None if 0 < v <= 1 else ("must be a fraction in (0, 1]", "e.g. --target-accuracy 0.97")


def _holdout(v: int) -> tuple[str, str] | None:
    most = min(TRAIN_EXAMPLES.values()) - 1
    return None if 1 <= v <= most else (f"must be between 1 and {most:,} examples", "e.g. --holdout 6000, a tenth of the training set")


class Recorded:
    """Whether a checkpoint records an option, so that a resume must repeat it."""

    NEVER = "never"
    ALWAYS = "always"
    # Only when it differs from its default: checkpoints from before the option existed still
    # match a resume that does not give it.
    WHEN_SET = "when set"
    # Whenever --holdout is given, its default included: which examples were held out.
    WITH_HOLDOUT = "with --holdout"


@dataclass(frozen=True)
class JobOption:
    name: str  # the attribute; the flag is --name-with-dashes
    type: type
    default: Any  # None for epochs and batch size: the job's own
    help: str
    check: Check | None = None
    metavar: str | None = None
    recorded: str = Recorded.NEVER
    help_in: dict[str, str] = field(default_factory=dict)  # another help text in one command (bench)
    # On the worker's command line even at its default, so a run's recorded arguments show it. The
    # others appear only when set, so that an image built before they existed still runs the rest.
    always_passed: bool = False
    parser: Callable[[str], Any] | None = None  # the command line's own reading of a value, where not the type's

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def typer_annotation(self, command: str) -> Any:
        import typer

        kind = self.type if self.default is not None else self.type | None
        decls = (self.flag,) if self.type is bool else ()
        return Annotated[kind, typer.Option(*decls, metavar=self.metavar, help=self.help_in.get(command, self.help), parser=self.parser)]


def _doc(help: str, check: Check | None = None, *, metavar: str | None = None, recorded: str = Recorded.NEVER,
         help_in: dict[str, str] | None = None, always_passed: bool = False,
         parser: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """A job option's command-line side, for its field's metadata (JobOption's fields by name)."""
    return {"option": {"help": help, "check": check, "metavar": metavar, "recorded": recorded, "help_in": help_in or {},
                       "always_passed": always_passed, "parser": parser}}


@dataclass(frozen=True)
class JobOptions:
    """The built-in jobs' options, each declared once: its type and default as a field, the rest in
    the field's metadata. ``extra`` holds the job's own (``-o width=8``), as its JobSpec declares them."""

    epochs: int | None = field(default=None, metadata=_doc("Jobs: train until this many epochs are done (default 1).", at_least(1), always_passed=True))
    batch_size: int | None = field(default=None, metadata=_doc("Jobs: per-rank batch size (lenet 64, fashion 32); the learning rate scales with it.",
              at_least(1), recorded=Recorded.ALWAYS, always_passed=True))
    max_steps: int | None = field(default=None, metadata=_doc("Jobs: at most this many training steps and validation batches per epoch.", at_least(1)))
    seed: int = field(default=42, metadata=_doc("Jobs: random seed (bench: of its first try; try k uses SEED + k - 1).", at_least(0),
              always_passed=True))
    target_accuracy: float | None = field(default=None, metadata=_doc("Jobs: stop once the averaged validation accuracy reaches this fraction.", _fraction,
              help_in={"bench": "Time to this rank-averaged validation accuracy (default: the job's, lenet 0.985)."}))
    warmup_epochs: float = field(default=WARMUP_EPOCHS, metadata=_doc("Jobs: epochs of linear learning-rate warmup to the scaled rate.", _warmup,
              always_passed=True))
    lr_scaling: float = field(default=1.0, metadata=_doc("Jobs: the learning rate grows with the images an update averages (ranks x accumulated "
              "batches x batch size / the job's) to this power: 1 linear, 0.5 square root, 0 not at all.", _power, metavar="POWER"))
    eval_every: int | None = field(default=None, metadata=_doc("Jobs: also evaluate every this many training steps, not only after each epoch (time to "
              "--target-accuracy in steps, not epochs).", at_least(1), metavar="STEPS",
              help_in={"bench": "Jobs: evaluate every this many steps (default: four times an epoch)."}))
    eval_examples: int | None = field(default=None, metadata=_doc("Jobs: validation examples each evaluation uses, over all ranks (default: the whole set).",
              at_least(1), metavar="N"))
    holdout: int | None = field(default=None, metadata=_doc("Jobs: hold out this many training examples (the same ones for every seed) as the validation "
              "set that evaluations and --target-accuracy use; the test set is then scored once, after training (test_accuracy).",
              _holdout, metavar="N", recorded=Recorded.WHEN_SET))
    holdout_split: int = field(default=HOLDOUT_SPLIT, metadata=_doc(f"Jobs: with --holdout, which examples: split {HOLDOUT_SPLIT} (the default) "
              f"was drawn for reported runs and no tuning has seen it; split {TUNED_SPLIT} is the one LeNet's schedule was tuned on "
              "(the figures up to 2026-12-03), split 1 the one issue 66's headline and its tuning used; another number draws "
              "another.", at_least(0), metavar="S",
              recorded=Recorded.WITH_HOLDOUT))
    fp16_allreduce: bool = field(default=False, metadata=_doc("Jobs: send gradients as float16 (Horovod's fp16 compression).",
              recorded=Recorded.WHEN_SET))
    sync_every: int | None = field(default=1, metadata=_doc("Jobs: the ranks talk once every K batches instead of after each (see --sync-mode); "
              "one model-sized allreduce per K batches. auto: the newest bench's choice (bench --sync-candidates).",
              sync.CHECKS["sync_every"], metavar="K|auto", recorded=Recorded.WHEN_SET, parser=sync.parse_every,
              help_in={"bench": "Jobs: the ranks talk once every K batches instead of after each (see --sync-mode)."}))
    sync_mode: sync.SyncMode = field(default=sync.SyncMode.GRADS, metadata=_doc("Jobs: with --sync-every K, grads: accumulate K batches' "
              "gradients per allreduce and update (the rate scales with ranks x K); weights: K local updates per rank, then "
              "the models averaged (local SGD; the rate is one rank's).", recorded=Recorded.WHEN_SET))
    outer_lr: float = field(default=1.0, metadata=_doc("Jobs: --sync-mode weights: the outer step's rate on the change since the last sync "
              "(1 with no momentum: the plain average).", sync.CHECKS["outer_lr"], recorded=Recorded.WHEN_SET))
    outer_momentum: float = field(default=0.0, metadata=_doc("Jobs: --sync-mode weights: the outer step's Nesterov momentum (DiLoCo: 0.9 "
              "with --outer-lr 0.7); 0: none.", sync.CHECKS["outer_momentum"], recorded=Recorded.WHEN_SET))
    steps_per_execution: int = field(default=8, metadata=_doc("Jobs: training steps per call of the compiled step function (Keras' "
              "steps_per_execution): Python's per-step cost is paid once per N.", at_least(1), metavar="N", always_passed=True))
    tf_threads: int | None = field(default=None, metadata=_doc("Jobs: TensorFlow's intra-op threads per rank (default: the node's cores divided among its "
              "ranks).", at_least(1), metavar="N"))
    extra: dict[str, Any] = field(default_factory=dict)

    def given(self) -> list[str]:
        """The options that differ from their defaults, as the user would have typed them."""
        return [o.flag for o in OPTIONS if getattr(self, o.name) != o.default] + [f"-o {k}=..." for k in self.extra]

    def check(self) -> None:
        """Each given value against its option's check: one UsageError for the first that fails."""
        for o in OPTIONS:
            value = getattr(self, o.name)
            problem = o.check(value) if o.check is not None and value is not None else None
            if problem is not None:
                raise UsageError(f"{o.flag} {value} {problem[0]}", problem[1])
        if self.holdout_split != HOLDOUT_SPLIT and not self.holdout:
            raise UsageError(f"--holdout-split {self.holdout_split} picks the examples --holdout keeps apart, and none are",
                             "add --holdout N, or drop --holdout-split")
        if self.sync_every is None:
            raise UsageError("--sync-every auto is edgetrain run's: it takes the newest bench's choice",
                             "edgetrain bench chooses among --sync-candidates K1,K2,...")
        # The settings together: an outer step is for weights, and so is no compression of them.
        if sync_of(vars(self)).sync_mode is sync.SyncMode.WEIGHTS and self.fp16_allreduce:
            raise UsageError("--fp16-allreduce compresses gradients; --sync-mode weights averages the weights in full",
                             "drop --fp16-allreduce, or use --sync-mode grads")


def _kind(annotation: Any) -> Any:
    """An option's type from its field's: ``int | None`` is an int option whose value may be missing."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
    return kinds[0] if kinds else annotation


_HINTS = typing.get_type_hints(JobOptions)
OPTIONS: tuple[JobOption, ...] = tuple(JobOption(f.name, _kind(_HINTS[f.name]), f.default, **f.metadata["option"])
                                       for f in fields(JobOptions) if "option" in f.metadata)
BY_NAME = {o.name: o for o in OPTIONS}
SYNC_OPTIONS = ("sync_every", "sync_mode", "outer_lr", "outer_momentum")
EXTRA_HELP = "Jobs: an option the job declares (fashion: depth=2, width=16); repeatable."


def sync_of(values: dict[str, Any]) -> sync.Sync:
    """How often the ranks talk, from the options' values (by name)."""
    return sync.Sync(**{name: values[name] for name in SYNC_OPTIONS})


def argv(values: dict[str, Any]) -> list[str]:
    """``edgetrain.rank.training``'s command line for resolved values (JobOption.always_passed)."""
    out: list[str] = []
    for o in OPTIONS:
        value = values[o.name]
        # Which examples were held out goes with --holdout, default or not: a worker of an older
        # image, whose default differs, then trains on the split the controller records (or refuses it).
        told = o.always_passed or (o.recorded == Recorded.WITH_HOLDOUT and values["holdout"])
        if value is None or value is False or (value == o.default and not told):
            continue
        out += [o.flag] if o.type is bool else [o.flag, str(getattr(value, "value", value))]
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The same options on ``edgetrain.rank.training``'s argparse parser, with the same defaults."""
    for o in OPTIONS:
        if o.type is bool:
            parser.add_argument(o.flag, action="store_true")
        else:
            parser.add_argument(o.flag, type=o.type, default=o.default)


def recorded(values: dict[str, Any], job_options: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of a run's options (and so what a resume must repeat)."""
    found = {o.name: values[o.name] for o in OPTIONS if o.recorded == Recorded.ALWAYS}
    found.update(job_options)
    found.update({o.name: values[o.name] for o in OPTIONS if o.recorded == Recorded.WHEN_SET and values[o.name] != o.default})
    found.update({o.name: values[o.name] for o in OPTIONS if o.recorded == Recorded.WITH_HOLDOUT and values["holdout"]})
    return found


def as_run(values: dict[str, Any], job_options: dict[str, Any]) -> dict[str, Any]:
    """Every option as the run gets it, in JSON's types, the job's own under ``options``: what a
    bench's try trained on (bench.json keeps it with each try, the held-out split included)."""
    return {**{o.name: getattr(values[o.name], "value", values[o.name]) for o in OPTIONS}, "options": dict(job_options)}


# Options a checkpoint recorded under a name since replaced, by their names now: a resume of a run
# from before --sync-every finds backward_passes_per_step N as --sync-every N (the same accumulation).
RENAMED = {"backward_passes_per_step": "sync_every"}


def saved(recorded_options: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's recorded options under today's names; one that held examples out before
    --holdout-split existed held out split 0."""
    found = {RENAMED.get(k, k): v for k, v in recorded_options.items()}
    if found.get("holdout"):
        found.setdefault("holdout_split", TUNED_SPLIT)
    return found


def with_job_options(command: str, parse_extra: Callable[[list[str]], dict[str, Any]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A typer command gets every job option and ``-o NAME=VALUE``, and receives them as one
    ``JobOptions`` in its ``options`` parameter."""
    import typer

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "options"]
        added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.typer_annotation(command))
                 for o in OPTIONS]
        extra = inspect.Parameter("option", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            list[str] | None, typer.Option("--option", "-o", metavar="NAME=VALUE", help=EXTRA_HELP)])

        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> None:
            values = {o.name: kwargs.pop(o.name) for o in OPTIONS}
            extra = parse_extra(kwargs.pop("option") or [])
            func(**kwargs, options=JobOptions(**values, extra=extra))

        params = [*own, *added, extra]
        # What typer reads (inspect.signature); typeshed declares no __signature__ on a function.
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
