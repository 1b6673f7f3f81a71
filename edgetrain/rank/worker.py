"""What every rank runs: ``mpirun ... python -m edgetrain.rank.worker [options] -- SCRIPT [ARGS...]``.

A middleman between Hydra and the program (the user's script, or a built-in job's module): it
sends the rank's output to ``rank.N.log`` (rank 0's also to the console), starts the program in
the rank's working copy of the shipped folder with the node's datasets where Keras looks for
them (MNIST's load_data(): edgetrain.rank.keras_datasets), sets up the rank's environment as its
strategy says (edgetrain.rank.strategies), and records how the rank ended: a failure record
(``rank.N.failure.json``) for the launcher to read, and on rank 0 the list of files the program
wrote (``outputs.json``) for ``edgetrain collect``. A rank that a signal ends cannot write its
record: its keeper does (edgetrain.rank.keeper).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import io
import json
import os
import re
import runpy
import shutil
import socket
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from edgetrain.shared import checkpoints, failures, mpi, progress, tempdirs, workdir
from edgetrain.rank import keeper, keras_datasets, pmi
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.progress import Events
from edgetrain.shared.layout import RunLayout
from edgetrain.shared.runs import RUN_AS
from edgetrain.rank.strategies import STRATEGIES, Strategy, horovod_module
from edgetrain.shared.strategies import DEFAULT, Name

# Where Keras' ``load_data()`` looks for each dataset's files, under ``~/.keras/datasets``.
KERAS_LAYOUT = {
    "fashion-mnist": ("fashion-mnist", ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                                        "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")),
    "mnist": ("", ("mnist.npz",)),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="edgetrain.rank.worker")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--store", type=Path, help="the node's file store (with --workdir-manifest)")
    p.add_argument("--data", type=Path, help="the node's datasets, DIR/<dataset>/<files>")
    p.add_argument("--strategy", choices=tuple(Name), default=DEFAULT)
    p.add_argument("--peers", default="", help="what the strategy tells every rank of its peers: JSON, its record in edgetrain.shared.strategies")
    p.add_argument("--events-token", default="", help="marks this attempt's events for the launcher (edgetrain.shared.progress)")
    p.add_argument("--job-name", default="", help="names the run's checkpoints (EDGETRAIN_JOB)")
    p.add_argument("--resume-from", default="", help="the checkpoint a resumed run starts from (EDGETRAIN_RESUME_FROM)")
    p.add_argument("--quiet", action="store_true", help="rank 0's output goes to its log only (the program reports events)")
    p.add_argument("--module", action="store_true", help="the program is a module name, not a script path")
    p.add_argument("program")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def run_as_login_user(record: Path = Path(RUN_AS)) -> None:
    """Ranks start as root in a container; they run as the node's login user, so the checkpoints,
    logs and outputs they write in the node's run directory are that user's to collect and delete."""
    if os.getuid() != 0 or not record.is_file():
        return
    uid, gid = (int(x) for x in record.read_text().split(":"))
    if uid == 0:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    home = Path(tempfile.gettempdir()) / f"edgetrain-home-{uid}"
    home.mkdir(mode=0o700, exist_ok=True)
    os.environ["HOME"] = str(home)  # root's home is not the user's to write (Keras' cache lives there)


def _redirect(log: Path, tee: bool) -> tuple[int, threading.Thread | None]:
    """Point fds 1 and 2 (TensorFlow's C++ logging included) at the rank log, or through a pipe
    that a thread copies to both the log and the console. Returns a dup of the original stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    console = os.dup(1)
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pump = None
    if tee:
        r, w = os.pipe()
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)

        def copy() -> None:
            # The pipe is drained whatever happens to the log: a full disk must not block the rank
            # writing its output (it would hang there, and its peers in their next collective).
            log_ok = console_ok = True
            while block := os.read(r, 65536):
                if log_ok:
                    log_ok = _write_all(log_fd, block)
                if console_ok:
                    console_ok = _write_all(console, block)

        pump = threading.Thread(target=copy, daemon=True)
        pump.start()
    else:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
    sys.stdout, sys.stderr = _LogStream.text(1), _LogStream.text(2)
    return console, pump


class _LogStream(io.RawIOBase):
    """fd 1 or 2 as the rank's Python code writes to it: a line the log's full disk cannot take is
    dropped, not raised, as the console copy's pump drops it. A print must not end a run: which
    write met a full disk first would otherwise be a log line's, unnamed, on whichever rank printed;
    the run's own files (a checkpoint, a metrics line, run.json) meet it and say so."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    @classmethod
    def text(cls, fd: int) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BufferedWriter(cls(fd)), line_buffering=True)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data) -> int:
        try:
            return os.write(self.fd, data)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return len(data)


def _write_all(fd: int, data: bytes) -> bool:
    """Write all of ``data``; False (and nothing raised) once the file cannot take more."""
    try:
        while data:
            data = data[os.write(fd, data):]
        return True
    except OSError:
        return False


def _say(text: str) -> None:
    """A line in the rank's log, given up if the log's disk is full."""
    try:
        print(text, flush=True)
    except OSError:
        pass


def link_datasets(data: Path, keras_home: Path) -> list[str]:
    """Make the node's datasets appear in Keras' cache; files already there are left alone."""
    linked = []
    for dataset, (subdir, names) in KERAS_LAYOUT.items():
        for name in names:
            src = data / dataset / name
            dst = keras_home / "datasets" / subdir / name
            if src.is_file() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.unlink(missing_ok=True)  # a dangling link from an older run
                try:
                    dst.symlink_to(src.resolve())
                except FileExistsError:
                    pass  # another rank of this node, sharing the cache, made it just now
                linked.append(dataset)
    return sorted(set(linked))


def keras_home() -> Path:
    """``~/.keras``, or ``/tmp/.keras`` where Keras falls back when the home is not writable."""
    home = Path(os.path.expanduser("~")) / ".keras"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / ".keras"


def record_outputs(run_dir: Path, cwd: Path, outputs: Path, manifest: workdir.Manifest | None) -> None:
    """Rank 0's files for ``collect``: new or changed in its working copy, and the output dir."""
    work = workdir.changed(manifest, cwd) if manifest is not None else {}
    out = workdir.changed(workdir.Manifest(outputs, ()), outputs) if outputs.is_dir() else {}
    listed = RunLayout(run_dir).outputs_list
    tmp = listed.with_name(f".{listed.name}.tmp")
    try:
        with checkpoints.naming(listed):
            tmp.write_text(json.dumps({RunLayout.WORK: work, RunLayout.OUTPUTS: out}, indent=1, sort_keys=True))
        os.replace(tmp, listed)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written list is left behind
        raise


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.args[:1] == ["--"]:
        args.args = args.args[1:]
    run_as_login_user()
    rank, size = mpi.rank_and_size()
    run_dir = args.run_dir
    failures.clear(run_dir, rank)
    log = RunLayout(run_dir).log(rank)
    keeper_pid = keeper.keep(run_dir, rank, log)  # from here on, this is the rank's own process
    # TensorFlow's start-up INFO lines would otherwise fill rank 0's console; warnings still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    console, pump = _redirect(log, tee=rank == 0 and not args.quiet)
    events = Events(os.fdopen(console, "w", buffering=1), enabled=rank == 0 and bool(args.events_token), token=args.events_token)
    host = socket.gethostname()
    _say(f"rank {rank}/{size} on {host} (pid {os.getpid()}, keeper {keeper_pid})")
    # TensorFlow's autograph writes the functions it converts to temp files that only an atexit
    # hook removes, and the os._exit below skips those hooks: they go in a directory of our own.
    scratch = tempfile.tempdir = tempdirs.make(f"rank{rank}")
    code = 1
    try:
        # Every rank says it started, on the launcher's stream: a run none of whose workers started
        # (mpirun ran something else in their place) is never taken for a completed one.
        Events(events.stream, enabled=bool(args.events_token), token=args.events_token).emit("rank", rank=rank, host=host)
        code = _run(args, rank, size, host, console, events)
    except BaseException as exc:  # noqa: BLE001 - a failure of edgetrain's own tail (a full disk...)
        _failed(run_dir, rank, host, events, exc)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        # Whatever happened above, this rank ends here (never through Python's own exit, whose
        # atexit hooks wait on MPI), and a failed rank takes the job down with it.
        _end(code, scratch, pump, abort=size > 1 and code not in (0, 130))


def _failed(run_dir: Path, rank: int, host: str, events: Events, exc: BaseException, **how) -> None:
    """Record a failure: traceback in the log, a failure record, and (rank 0) a "failed" event on
    the launcher's stream, which needs no disk: on a full disk it is all that gets through."""
    tb = traceback.format_exc() if "tb" not in how else how.pop("tb")
    error, advise = how.pop("error", None), how.pop("advise", None)
    if error is None and isinstance(exc, EdgetrainError):
        error, how["fix"] = exc.problem, exc.fix  # edgetrain's own words, from the strategy's set-up
    if error is None:
        error, how["fix"] = failures.disk_full(exc, run_dir) or (f"{type(exc).__name__}: {exc}", None)
    if not how.get("fix") and advise is not None:
        how["fix"] = advise(error)  # a script written for another strategy says so
    try:
        sys.stderr.write(tb or "")
        sys.stderr.flush()
    except OSError:
        pass  # the log's disk is full: the record (if it fits) and the event still follow
    f = failures.write(run_dir, rank, host, error, tb, **how)
    try:
        events.emit("failed", **{k: v for k, v in f.__dict__.items() if k != "traceback"})
    except (OSError, ValueError):
        pass


def _run(args: argparse.Namespace, rank: int, size: int, host: str, console: int, events: Events) -> int:
    """Run the program, then (rank 0) list its outputs and (Horovod) wait for every rank at the
    final barrier. Returns the rank's exit status."""
    run_dir, strategy = args.run_dir, STRATEGIES[args.strategy]
    # Each rank has a working copy and an output directory of its own; rank 0's are the run's.
    layout = RunLayout(run_dir)
    cwd, outputs = layout.work(rank), layout.outputs(rank)
    manifest = None
    code = 0
    try:
        manifest = _working_copy(args, cwd, outputs)
        _environment(args, rank, console, outputs)
        role = strategy.set_up(rank, args.peers, args.args)
        if role.serve is not None:
            role.serve()  # in the program's place: the program does not run on this rank
        else:
            _program(args, cwd if manifest is not None else None, role.args, strategy.keeps_program)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            code = exc.code if isinstance(exc.code, int) else 1
            _failed(run_dir, rank, host, events, exc, error=f"the program exited with status {exc.code}", tb=None, kind=failures.Kind.EXIT)
    except BaseException as exc:  # noqa: BLE001 - any failure must end this rank loudly
        _failed(run_dir, rank, host, events, exc, advise=strategy.advice)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    unmet = strategy.unmet(size) if code == 0 else None
    if unmet is not None:
        failures.write(run_dir, rank, host, unmet.error, None, fix=unmet.fix, kind=unmet.kind)
        code = 1
    if rank == 0:
        try:
            record_outputs(run_dir, cwd, outputs, manifest)
        except OSError as exc:
            _say(f"edgetrain: could not list rank 0's outputs: {exc}")
    return _ended(run_dir, rank, host, events, strategy) if code == 0 else code


def _working_copy(args: argparse.Namespace, cwd: Path, outputs: Path) -> workdir.Manifest | None:
    """The rank's copy of the shipped folder (and its manifest), or None for a program that ships none."""
    manifest = None
    manifest_file = RunLayout(args.run_dir).workdir_manifest
    if args.store is not None and manifest_file.is_file():
        manifest = workdir.Manifest.from_json(manifest_file.read_text())
        workdir.materialize(manifest, args.store, cwd)
    cwd.mkdir(parents=True, exist_ok=True)
    outputs.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)
    return manifest


def _environment(args: argparse.Namespace, rank: int, console: int, outputs: Path) -> None:
    os.environ.update(EDGETRAIN_RUN_DIR=str(args.run_dir), EDGETRAIN_OUTPUT_DIR=str(outputs), EDGETRAIN_RANK=str(rank),
                      EDGETRAIN_JOB=args.job_name)
    if args.resume_from:
        os.environ["EDGETRAIN_RESUME_FROM"] = args.resume_from
    if rank == 0 and args.events_token:
        os.environ.update({"EDGETRAIN_EVENTS_FD": str(console), progress.TOKEN_ENV: args.events_token})
    if args.data is not None:
        os.environ["EDGETRAIN_DATA"] = str(args.data)
        link_datasets(args.data, keras_home())
        if (args.data / "mnist").is_dir():
            keras_datasets.serve_mnist(args.data)


_KEPT: list[object] = []  # what a program made, where its strategy keeps it to the rank's end


def _program(args: argparse.Namespace, shipped_to: Path | None, program_args: tuple[str, ...], keep: bool) -> None:
    """Run the module or script as ``__main__`` (a shipped script from the rank's working copy);
    with ``keep``, its globals - or the exception that holds its frames - live until os._exit."""
    try:
        if args.module:
            sys.argv = [args.program, *program_args]
            made = runpy.run_module(args.program, run_name="__main__", alter_sys=True)
        else:
            script = str(shipped_to / args.program) if shipped_to is not None else args.program
            sys.argv = [script, *program_args]
            sys.path.insert(0, str(Path(script).parent))
            made = runpy.run_path(script, run_name="__main__")
    except BaseException as exc:
        if keep:
            _KEPT.append(exc)
        raise
    if keep:
        _KEPT.append(made)


def _ended(run_dir: Path, rank: int, host: str, events: Events, strategy: Strategy) -> int:
    """The program returned: say so, do what the strategy does at a rank's end, and under Horovod
    wait for every rank at the final barrier."""
    try:
        failures.mark_ended(run_dir, rank)
    except OSError:
        pass  # a hint for the launcher's attribution, not needed to finish
    strategy.ended()
    hvd = horovod_module()
    if hvd is None:
        return 0
    try:
        # An allreduce is a barrier: once it completes every rank has run its program to the end.
        hvd.allreduce(sys.modules["tensorflow"].constant(0), name="edgetrain.finished")
        events.emit("finished")
    except BaseException as exc:  # noqa: BLE001
        said = str(exc).split("}}")[-1].strip().splitlines()[0] if str(exc) else type(exc).__name__
        failures.write(run_dir, rank, host, "its script ended while other ranks were still training",
                       traceback.format_exc(), fix=f"run the same collective steps on every rank (Horovod: {said})",
                       kind=failures.Kind.ENDED_EARLY)
        return 1
    return 0


def _end(code: int, scratch: str, pump: threading.Thread | None, abort: bool = False) -> None:
    """End without MPI_Finalize or atexit hooks: MPICH 4.0.2's ch4:ucx can hang in MPI_Finalize
    for good when two ranks of a node and ranks of other nodes talk over TCP (seen on the
    testbed). Hydra is told the end is meant (edgetrain.rank.pmi), else it may report a rank that
    finished as dead; the launcher still goes by the "finished" event.

    A failed rank (``abort``) calls MPI_Abort: a rank that merely exits is not enough for Hydra
    to end the others (seen on the testbed: rank 0 failed on a full disk, and the ranks of the
    other nodes waited in their allreduce for good). Nothing here may keep the rank from ending
    (a flush into a full disk raises, an abort could block): os._exit comes last, whatever."""
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        shutil.rmtree(scratch, ignore_errors=True)
        if abort:
            _abort_job(code)
        else:
            pmi.finalize()
        if pump is not None:
            os.close(1)
            os.close(2)
            pump.join(timeout=5)
    finally:
        os._exit(code)


MPI_COMM_WORLD = 0x44000000  # MPICH's handle (mpi.h)
ABORT_GRACE = 15.0  # seconds MPI_Abort may take before this rank ends regardless


def _abort_job(code: int) -> None:
    """MPI_Abort(MPI_COMM_WORLD) if this process initialized MPI (Horovod does, from the MPI
    library it loaded), else PMI's abort (torch, tf-multiworker): Hydra then ends every rank of
    the job on every node."""
    mpi = _mpi_in_use()
    if mpi is None:
        pmi.abort(code)
        return
    threading.Timer(ABORT_GRACE, os._exit, (code,)).start()
    mpi.MPI_Abort(ctypes.c_int(MPI_COMM_WORLD), ctypes.c_int(code))


def _mpi_in_use():
    """The MPI library this process initialized and has not finalized, else None."""
    try:
        with open("/proc/self/maps") as maps:
            lib = next((line.split()[-1] for line in maps if re.search(r"/libmpi(ch)?(_\w+)?\.so", line)), None)
        if lib is None:
            return None
        mpi = ctypes.CDLL(lib)
        initialized, finalized = ctypes.c_int(0), ctypes.c_int(0)
        if mpi.MPI_Initialized(ctypes.byref(initialized)) != 0 or not initialized.value:
            return None
        if mpi.MPI_Finalized(ctypes.byref(finalized)) != 0 or finalized.value:
            return None
        return mpi
    except (OSError, AttributeError):
        return None


if __name__ == "__main__":
    main()
