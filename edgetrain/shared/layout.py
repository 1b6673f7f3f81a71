"""The run directory's layout: every name in ``runs/<run-id>/``, the one place each is spelled
(tests/unit/test_layout.py fails on one spelled elsewhere). The same layout serves this machine's
run directory (a ``Path``), a node's copy of it and a container's mount of it (``PurePosixPath``s
that the controller turns into shell arguments), and the ranks' view through
``$EDGETRAIN_RUN_DIR``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePath, PurePosixPath
from typing import ClassVar, Generic, TypeVar

P = TypeVar("P", bound=PurePath)


class RankFile(str, Enum):
    """What each rank leaves in the run directory, as ``rank.<rank>.<kind>``."""

    LOG = "log"  # everything it printed
    FAILURE = "failure.json"  # its failure record (edgetrain.shared.failures)
    ENDED = "ended"  # the mark that its program returned


@dataclass(frozen=True)
class RunLayout(Generic[P]):
    """The paths of the run directory ``path``. The names alone, the upper-case class attributes,
    are for lists relative to a run directory (what a node sends back, what ``collect`` fetches)."""

    path: P

    RECORD: ClassVar[str] = "run.json"  # the controller's record of the run (edgetrain.shared.record)
    METRICS: ClassVar[str] = "metrics.jsonl"  # rank 0's records, one JSON line each
    CHECKPOINTS: ClassVar[str] = "checkpoints"  # edgetrain.shared.checkpoints, written by rank 0
    MACHINEFILE: ClassVar[str] = "machinefile"  # Hydra's host:slots lines, for the host runtime's mpirun
    LOCK: ClassVar[str] = ".lock"  # flocked while a command holds the run
    WORKDIR_MANIFEST: ClassVar[str] = "workdir.json"  # what was shipped of the working directory
    # Rank 0's working copy, its output directory, and its list of what its program wrote in them
    # (keyed by these two names) for ``collect``; every other rank's two are under RANKS/<rank>/.
    WORK: ClassVar[str] = "work"
    OUTPUTS: ClassVar[str] = "outputs"
    OUTPUTS_LIST: ClassVar[str] = "outputs.json"
    RANKS: ClassVar[str] = "ranks"
    TENSORBOARD: ClassVar[str] = "tensorboard"  # rank 0's TensorBoard files
    DATA: ClassVar[str] = "data"  # the host runtime's datasets, one directory as in a container
    # A container's lease: the controller renews LEASE_FILE on the node, and the container mounts
    # LEASE_DIR read-only over its own, so that no rank can renew it.
    LEASE_DIR: ClassVar[str] = ".lease"
    LEASE_FILE: ClassVar[str] = "renewed"
    RANK_FILE: ClassVar[str] = "rank.{rank}.{kind}"  # each rank's files, of the kinds in RankFile

    @staticmethod
    def posix(path: str) -> RunLayout[PurePosixPath]:
        """A node's run directory, or a container's mount of one: its paths name files there, in
        the commands the controller runs there."""
        return RunLayout(PurePosixPath(path))

    @property
    def info_file(self) -> P:
        return self.path / self.RECORD

    @property
    def metrics_file(self) -> P:
        return self.path / self.METRICS

    @property
    def checkpoints(self) -> P:
        return self.path / self.CHECKPOINTS

    @property
    def machinefile(self) -> P:
        return self.path / self.MACHINEFILE

    @property
    def lock_file(self) -> P:
        return self.path / self.LOCK

    @property
    def workdir_manifest(self) -> P:
        return self.path / self.WORKDIR_MANIFEST

    @property
    def outputs_list(self) -> P:
        return self.path / self.OUTPUTS_LIST

    @property
    def tensorboard(self) -> P:
        return self.path / self.TENSORBOARD

    @property
    def data(self) -> P:
        return self.path / self.DATA

    @property
    def lease_dir(self) -> P:
        return self.path / self.LEASE_DIR

    @property
    def lease(self) -> P:
        return self.lease_dir / self.LEASE_FILE

    def _own(self, rank: int) -> P:
        """Where a rank's working copy and output directory are: rank 0's are the run's."""
        return self.path if rank == 0 else self.path / self.RANKS / str(rank)

    def work(self, rank: int = 0) -> P:
        return self._own(rank) / self.WORK

    def outputs(self, rank: int = 0) -> P:
        return self._own(rank) / self.OUTPUTS

    def rank_file(self, rank: int, kind: RankFile) -> P:
        return self.path / self.rank_name(rank, kind)

    def log(self, rank: int) -> P:
        return self.rank_file(rank, RankFile.LOG)

    def rank_files(self: RunLayout[Path], kind: RankFile) -> dict[int, Path]:
        """The files of ``kind`` in this run directory, by rank; a name that is not a rank's
        (``rank.x.log``) is none."""
        found = {self.rank_of(p.name, kind): p for p in self.path.glob(self.rank_name("*", kind))}
        return {rank: p for rank, p in found.items() if rank is not None}

    @classmethod
    def rank_name(cls, rank: int | str, kind: RankFile) -> str:
        """``rank.3.log``; with ``rank`` ``"*"``, the glob pattern of every rank's."""
        return cls.RANK_FILE.format(rank=rank, kind=kind.value)

    @classmethod
    def rank_of(cls, name: str, kind: RankFile) -> int | None:
        """The rank a file of a run directory is named for (``rank.3.log`` of kind LOG); None for
        a name that is not a rank's, whatever a node sent."""
        pattern = re.escape(cls.rank_name("RANK", kind)).replace("RANK", "(0|[1-9][0-9]{0,5})")
        m = re.fullmatch(pattern, name)
        return int(m.group(1)) if m else None
