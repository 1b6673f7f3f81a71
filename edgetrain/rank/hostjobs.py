"""One Hydra job per host, under one process, for a strategy whose run goes on without some of its
ranks (tf-ps: its workers): ``python -m edgetrain.rank.hostjobs [--events-token T] JOBS``.

Hydra ends a whole job when one of its nodes is lost: the proxy on a node whose container was
killed or whose link went dark drops its control connection, and MPICH 4.0.2's mpiexec ends the
job then (``control_cb`` in ``pmiserv_cb.c`` asserts the connection open); its proxy also kills
every process of a node once one dies by a signal (``pmip.c``). So such a run starts as one job per
host (``edgetrain.shared.mpi.HostJob``), each ``mpirun`` numbering its ranks from the job's first
(``mpi.RANK_BASE``), and the launcher starts this where it would start ``mpirun`` and reads its
output as it would read mpirun's.

It ends when the first job (rank 0's) ends, with that job's status: the other jobs get
OTHERS_GRACE to end by themselves (tf-ps's servers end with the chief), then are ended. A job of
expendable ranks that ends before that is reported (a ``lost`` event) and the others go on; any
other job that ends first ends them all, with its status. SIGINT and SIGTERM go on to every job.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from edgetrain.shared import mpi
from edgetrain.shared.progress import Events

POLL_S = 0.25  # how often the jobs are looked at: the run's end waits this long at most
OTHERS_GRACE = 30.0  # for the other jobs to end by themselves once rank 0's has
KILL_GRACE = 10.0  # from SIGTERM to SIGKILL


def status(code: int) -> int:
    """A job's exit status as a shell gives it (128 + N for a job ended by signal N)."""
    return 128 - code if code < 0 else code


class Jobs:
    def __init__(self, jobs: list[mpi.HostJob], events: Events) -> None:
        self.jobs, self.events = jobs, events
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for job in self.jobs:
            self.procs[job.host] = subprocess.Popen(job.argv, stdin=subprocess.DEVNULL)

    def signal(self, signum: int, frame=None) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def supervise(self) -> int:
        """Until the run ends; its exit status."""
        head, running = self.jobs[0], list(self.jobs)
        while True:
            for job in list(running):
                code = self.procs[job.host].poll()
                if code is None:
                    continue
                running.remove(job)
                if job is head:
                    return self.wind_up(status(code))
                if job.expendable:
                    self.events.emit("lost", host=job.host, ranks=list(job.ranks),
                                     why=f"the Hydra job of its ranks ended with status {status(code)}")
                    continue
                print(f"edgetrain: the Hydra job of ranks {', '.join(map(str, job.ranks))} on {job.host} ended with status "
                      f"{status(code)} before rank 0's: ending the run", flush=True)
                return self.wind_up(status(code) or 1, grace=0.0)
            time.sleep(POLL_S)

    def wind_up(self, code: int, grace: float | None = None) -> int:
        """The others' end: by themselves within ``grace`` (OTHERS_GRACE), else SIGTERM, then SIGKILL."""
        steps = ((None, OTHERS_GRACE if grace is None else grace), (signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, KILL_GRACE))
        for signum, wait in steps:
            if signum is not None:
                self.signal(signum)
            deadline = time.monotonic() + wait
            while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        return code


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="edgetrain.rank.hostjobs")
    p.add_argument("--events-token", default="", help="marks the lost-job events for the launcher (edgetrain.shared.progress)")
    p.add_argument("jobs", help="the jobs, rank 0's first, as edgetrain.shared.mpi.encode_jobs writes them")
    args = p.parse_args(argv)
    jobs = Jobs(mpi.decode_jobs(args.jobs), Events(sys.stdout, enabled=bool(args.events_token), token=args.events_token))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, jobs.signal)
    jobs.start()
    sys.exit(jobs.supervise())


if __name__ == "__main__":
    main()
