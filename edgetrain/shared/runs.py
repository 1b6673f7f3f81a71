"""Run directories (``runs/<run-id>/``, laid out by edgetrain.shared.layout): creating, finding,
locking and reading them."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import socket
import stat
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgetrain.shared import checkpoints, untrusted
from edgetrain.shared.errors import EdgetrainError, UsageError
from edgetrain.shared.layout import RankFile, RunLayout
from edgetrain.shared.record import NEXT, RunRecord
from edgetrain.shared.record import Status as Status  # re-exported: callers name a run's states runs.Status
from edgetrain.shared.untrusted import NUMBER


SCHEMA = 1  # of what ``runs list --json`` and ``runs show --json`` print
# In a container: uid:gid of the node's login user, whom the ranks run as so that the node's run
# directory stays that user's (written by the controller, read by the worker).
RUN_AS = "/etc/edgetrain/user"


def default_root() -> Path:
    return Path(os.environ.get("EDGETRAIN_RUNS", "runs"))


def write_anew(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Put ``data`` at ``path`` atomically and (unless not ``durable``) durably, as a new file: a
    link a rank left at the path or at its temporary name (ranks can write a run directory on the
    host runtime) is replaced, never written through. On an error (a full disk) the old file stays
    as it was."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            checkpoints.fsync_dir(path.parent)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Run(RunLayout[Path]):
    """A run directory on this machine: its paths, and its record, metrics and lock."""

    @property
    def id(self) -> str:
        return self.path.name

    def append_metrics(self, records: list[dict[str, Any]]) -> None:
        """Rank 0's records, a line each."""
        with checkpoints.naming(self.metrics_file), open(self.metrics_file, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def record(self) -> RunRecord:
        try:
            data = untrusted.load(self.info_file)
        except (OSError, ValueError) as exc:
            raise EdgetrainError(f"run {self.id} has no readable {self.RECORD} ({exc})") from None
        return RunRecord.from_json(data, self.id)

    def write(self, before: RunRecord | None, **changes: Any) -> RunRecord:
        """Rewrite run.json as ``before`` (the record it holds; None: none yet) with ``changes`` made
        (a first record needs ``job`` and ``status``), atomically and durably: a reader (or a crash, a
        power cut, or a full disk) sees the old file or the new one, never a part. A write that fails
        (a full disk) is one EdgetrainError naming the file; the old run.json is left as it was. Its
        one writer is an attempt's recorder (edgetrain.controller.recorder)."""
        if "status" in changes:
            changes["status"] = Status(changes["status"])
            was = before.status if before is not None else None
            if changes["status"] not in NEXT.get(was, frozenset()):
                raise ValueError(f"run {self.id}: status {was.value if was else 'none'} cannot become {changes['status'].value}")
        record = replace(before, **changes) if before is not None else RunRecord(**{"id": self.id, **changes})
        data = (json.dumps(record.to_json(), indent=2, sort_keys=True, default=str) + "\n").encode()
        try:
            write_anew(self.info_file, data)
        except OSError as exc:
            raise EdgetrainError(f"cannot write {self.info_file}: {exc.strerror or exc}",
                                 f"free disk space on this machine ({self.path.parent})") from None
        return record

    def metrics(self) -> list[dict[str, Any]]:
        """One dict per epoch; a damaged line (a rank killed mid-write) is left out, see ``damaged_metrics``."""
        return [m for _, m in self._metric_lines() if isinstance(m, dict) and "kind" not in m]

    def evaluations(self) -> list[dict[str, Any]]:
        """The ``eval`` records, in the order they were made (none in runs from before they existed)."""
        return [m for _, m in self._metric_lines() if isinstance(m, dict) and m.get("kind") == "eval"]

    def test_score(self) -> dict[str, Any] | None:
        """The test set's score, taken once after training (a run that held its validation set out
        of the training set: --holdout); None for any other run."""
        return next((m for _, m in reversed(self._metric_lines()) if isinstance(m, dict) and m.get("kind") == "test"), None)

    def damaged_metrics(self) -> list[tuple[int, str]]:
        """The lines of metrics.jsonl that are not a record of their kind: (number, what is wrong)."""
        return [(n, m) for n, m in self._metric_lines() if isinstance(m, str)]

    def _metric_lines(self) -> list[tuple[int, dict[str, Any] | str]]:
        """Each line's record, or what is wrong with it. Lines without a ``kind`` are the epochs'; a
        record of a kind this version does not know is kept unread, not counted as damage."""
        if not self.metrics_file.exists():
            return []
        found: list[tuple[int, dict[str, Any] | str]] = []
        for n, line in enumerate(self.metrics_file.read_text(errors="replace").splitlines(), 1):
            if line.strip():
                try:
                    value = untrusted.check(untrusted.loads(line), untrusted.Obj(optional={"kind": (str,)}))
                    schema = METRIC_RECORDS.get(value.get("kind"))
                    found.append((n, value if schema is None else untrusted.check(value, schema)))
                except json.JSONDecodeError:
                    found.append((n, "not JSON"))
                except ValueError as exc:
                    found.append((n, str(exc)))
        return found

    def lock(self) -> RunLock:
        """Hold the run for this process's life (or until released): a second run or resume of it
        is refused, and a run whose holder died is known to be over."""
        try:
            # Never through a link: the holder's name would be written over what it points to.
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EdgetrainError(f"cannot lock run {self.id}: {self.lock_file} is a link, not edgetrain's lock",
                                     "remove it (edgetrain makes it anew), then try again") from None
            raise EdgetrainError(f"cannot lock run {self.id}: {self.lock_file}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use() from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock is the flock, the holder's name only a courtesy
        return RunLock(fd)

    def _in_use(self) -> EdgetrainError:
        try:
            holder = self.lock_file.read_text(errors="replace").strip() or "another edgetrain"
        except OSError:
            holder = "another edgetrain"
        return EdgetrainError(f"run {self.id} is in use by {holder}",
                              "wait for that command to end (a run or resume of the same run cannot go twice)")

    def refuse_if_live(self) -> None:
        """Refuse early, without writing anything, a run another command holds."""
        if self.live():
            raise self._in_use()

    def live(self) -> bool:
        """Whether a command holds the run now."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def status(self) -> Status:
        """The recorded status, except that a run nobody holds is not still going (ABANDONED), and
        a record this version cannot read is DAMAGED."""
        try:
            status = self.record().status
        except EdgetrainError:
            return Status.DAMAGED
        if status in (Status.STARTING, Status.RUNNING) and not self.live():
            return Status.ABANDONED
        return status

    def logs(self) -> list[Path]:
        """The rank logs, by rank; a name that is not a rank's (``rank.x.log``) is not one."""
        found = self.rank_files(RankFile.LOG)
        return [found[rank] for rank in sorted(found)]


class RunLock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1


def ensure_writable(root: Path) -> Path:
    """Create the runs directory, or say clearly why it cannot be used."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        # A new file of our own, never one a link left at the (predictable) name points to.
        probe = root / f".write-test-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        probe.unlink()
    except OSError as exc:
        raise EdgetrainError(
            f"cannot write run directory {root}: {exc.strerror or exc}",
            "pass --runs-dir DIR (or set EDGETRAIN_RUNS) to a writable directory",
        ) from None
    return root


def slurm_dir(root: Path, create: bool = True) -> Path | None:
    """This user's corner of a runs root for Slurm: the jobs' console output (the whole console,
    for its owner only) and which run each submitted job is. The runs root may be a group's, so it
    is 0700, this user's and not a link, or not used; None where it does not exist (and not ``create``)."""
    path = root / f".slurm-{os.getuid()}"
    try:
        if create:
            path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EdgetrainError(f"cannot make {path}: {exc.strerror or exc}",
                             "pass --runs-dir DIR (or set EDGETRAIN_RUNS) to a writable directory") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise EdgetrainError(f"{path} is not a directory of yours that only you can read",
                             "remove it (edgetrain makes it anew), then try again")
    return path


def new_id(job: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{job}-{secrets.token_hex(2)}"


def create(root: Path, job: str, run_id: str | None = None) -> Run:
    """A new run directory, under ``run_id`` where one was chosen beforehand (a Slurm job's, by `submit`)."""
    if run_id is not None and not RUN_ID.fullmatch(run_id):
        raise UsageError(f"{run_id!r} is not a run id")
    ensure_writable(root)
    for _ in range(10):
        path = root / (run_id or new_id(job))
        try:
            path.mkdir(mode=0o700)  # the run's logs and outputs are the user's alone
        except FileExistsError:
            if run_id:
                raise EdgetrainError(f"run {run_id} exists already in {root}", "submit it anew, or continue it with --resume") from None
            continue
        run = Run(path)
        run.checkpoints.mkdir()
        return run
    raise EdgetrainError(f"could not create a new run directory in {root}")


# What each kind of metrics record must hold (an epoch's has no ``kind``): the fields that
# ``runs``, bench and the plots read, with their types. A script's own figures travel along unread.
NONE = type(None)
METRIC_RECORDS = {
    None: untrusted.Obj({"epoch": (int,)}, {**{k: NUMBER for k in ("loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec",
                                                                 "elapsed")}, "ranks": (int,)}),
    "eval": untrusted.Obj({"epoch": (int,), "val_accuracy": NUMBER},
                          {"step": (int,), "seconds": NUMBER, "train_seconds": (*NUMBER, NONE), "images": (int, NONE),
                           "val_loss": (*NUMBER, NONE), "eval_seconds": NUMBER, "examples": (int, NONE), "ranks": (int,),
                           "train_cpu_seconds": NUMBER, "resumed_after_epoch": (int,), "target_accuracy": NUMBER,
                           "reached": (bool,)}),
    "test": untrusted.Obj({"test_accuracy": NUMBER}, {"test_loss": (*NUMBER, NONE), "examples": (int, NONE), "after_epoch": (int,),
                                                      "step": (int,)}),
}
# Matched whole (fullmatch): ``$`` alone would take an id ending in a newline.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def find(root: Path, run_id: str) -> Run:
    """A run by id, or by a unique prefix of it (plain characters only: never a path or a pattern)."""
    return Run(find_dir(root, run_id, (Run.RECORD,)))


def find_dir(root: Path, run_id: str, markers: tuple[str, ...]) -> Path:
    """The directory of a run or bench (one holding any of ``markers``) by id or a unique prefix."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise UsageError(f"{run_id!r} is not a run id", "see the runs with: edgetrain runs list")

    def held(p: Path) -> bool:
        return any((p / m).is_file() for m in markers)

    if held(root / run_id):
        return root / run_id
    # A directory whose name is not a run id (one with a comma, a newline) is nobody's run.
    matches = sorted(p for p in root.iterdir() if p.name.startswith(run_id) and RUN_ID.fullmatch(p.name) and held(p)) if root.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise EdgetrainError(f"run id {run_id!r} is ambiguous: {', '.join(p.name for p in matches[:5])}", "give more of the id")
    raise EdgetrainError(f"no run {run_id!r} in {root}", "see the runs with: edgetrain runs list")


def this_run() -> Run:
    """The run a rank's process writes to: ``$EDGETRAIN_RUN_DIR``, which the worker sets; ./ for a
    script run outside edgetrain."""
    return Run(Path(os.environ.get("EDGETRAIN_RUN_DIR", ".")))


def job_name() -> str:
    """The job a rank trains: a built-in job's name (the worker sets it), else the script's."""
    return os.environ.get("EDGETRAIN_JOB") or Path(sys.argv[0]).stem


def all_runs(root: Path) -> list[Run]:
    if not root.is_dir():
        return []
    return sorted((r for r in map(Run, root.iterdir()) if r.info_file.is_file()), key=lambda r: r.id)


@dataclass(frozen=True)
class Summary:
    id: str
    job: str
    status: Status
    epochs: int
    val_accuracy: float | None
    images_per_sec: float | None
    checkpoint: int | None
    problems: tuple[str, ...] = ()  # what could not be read, one line each

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "status": self.status.value, "problems": list(self.problems)}


def summarize(run: Run) -> Summary:
    """A run's line in ``runs list``; whatever part of it is damaged is named, never fatal."""
    problems = []
    try:
        job = run.record().job
        status = run.status()
    except EdgetrainError as exc:
        job, status = "?", Status.DAMAGED
        problems.append(str(exc))
    metrics = run.metrics()
    problems += [f"run {run.id}: {run.METRICS} line {n} is damaged ({why}; left out)" for n, why in run.damaged_metrics()]
    last = metrics[-1] if metrics else {}
    newest = None
    for ckpt_dir in sorted(run.checkpoints.glob(f"{checkpoints.PREFIX}*"), reverse=True) if run.checkpoints.is_dir() else []:
        try:
            newest = checkpoints.read(ckpt_dir).epoch
            break
        except EdgetrainError as exc:
            problems.append(f"run {run.id}: {exc}")
    return Summary(
        id=run.id,
        job=job,
        status=status,
        epochs=len({m["epoch"] for m in metrics}),
        val_accuracy=last.get("val_accuracy"),
        images_per_sec=last.get("images_per_sec"),
        checkpoint=newest,
        problems=tuple(problems),
    )


# An accuracy is a count over the examples scored, but averaged over ranks or kept as float32 it can
# land a rounding below that fraction: 5,940 of 6,000 averaged over 3 ranks is 0.9899999999999999,
# which missed a 99.0% target. A millionth is more than any such rounding and less than one example
# in any split under a million.
ROUNDING = 1e-6


def reaches(accuracy: float, target: float) -> bool:
    """Whether an accuracy is at the target, a rounding below it counted as there (ROUNDING)."""
    return accuracy >= target - ROUNDING


def first_reaching(run: Run, target: float | None = None) -> dict[str, Any] | None:
    """The run's first evaluation at its target accuracy, the one time to the target is read from
    (`runs show`, bench, and so the lab): at ``target`` where given (bench's, which a script's ranks
    are not told), else at the target its ranks were given (their ``reached`` mark)."""
    for e in run.evaluations():
        if (reaches(e["val_accuracy"], target) if target is not None else e.get("reached")):
            return e
    return None


@dataclass(frozen=True)
class ToTarget:
    """A run's way to a target accuracy, None where it did not get there: seconds and images from its
    first step (its evaluations'), and seconds from the command, its last attempt's launch counted in."""
    seconds_to_target: float | None = None
    images_to_target: int | None = None
    seconds_to_target_from_launch: float | None = None


def to_target(run: Run, target: float) -> ToTarget:
    """The one reading of a run's time to ``target`` that bench and the lab record."""
    reached = first_reaching(run, target)
    if reached is None:
        return ToTarget()
    attempts = run.record().attempts
    launched = attempts[-1].first_step_s if attempts else None
    return ToTarget(reached["seconds"], reached.get("images"), launched + reached["seconds"] if launched is not None else None)


def time_to_target(run: Run) -> str | None:
    """When the run's evaluations reached its target accuracy (or that they did not, with the best
    one); None for a run without evaluation records."""
    evals = run.evaluations()
    if not evals:
        return None
    reached = first_reaching(run)
    target = next((e["target_accuracy"] for e in reversed(evals) if "target_accuracy" in e), None)
    best = reached or max(evals, key=lambda e: e["val_accuracy"])
    # Evaluation time is inside the clock; say how much of it, from the same attempt's records.
    attempt = [e for e in evals[:evals.index(best) + 1] if e.get("resumed_after_epoch") == best.get("resumed_after_epoch")]
    cost = sum(e.get("eval_seconds") or 0.0 for e in attempt)
    where = f"at {_seconds(best)} from the first step{_images(best)}, epoch {best.get('epoch', '?')} step {best.get('step', '?')}"
    tail = f" ({_count(len(attempt), 'evaluation')} took {cost:.1f} s of it"
    tail += f"; the clock restarted when the run resumed after epoch {best['resumed_after_epoch']})" if best.get("resumed_after_epoch") else ")"
    if reached is not None:
        return f"reached {_percent(reached.get('target_accuracy'))} val accuracy {where}{tail}"
    if target is not None:
        return f"{_percent(target)} val accuracy not reached in {_count(len(evals), 'evaluation')}; best {_percent(best['val_accuracy'], 2)} {where}{tail}"
    return f"no target accuracy; best {_percent(best['val_accuracy'], 2)} val accuracy {where}{tail}"


def _percent(fraction: float | None, places: int | None = None) -> str:
    if fraction is None:
        return "?"
    return f"{fraction * 100:.{places}f}%" if places is not None else f"{fraction * 100:.10g}%"


def _seconds(record: dict[str, Any]) -> str:
    value = record.get("seconds")
    return f"{value:.1f} s" if value is not None else "? s"


def _images(record: dict[str, Any]) -> str:
    value = record.get("images")
    return f", {value:,} images" if value is not None else ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
