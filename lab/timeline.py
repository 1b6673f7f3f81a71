"""Is the big gradient's allreduce hidden behind the backprop below it? ``python -m lab.timeline FILE``.

FILE is the timeline Horovod's rank 0 writes with ``HOROVOD_TIMELINE=/edgetrain/run/timeline.json``
(set in the inventory's ``edgetrain_mpi_env``, beside ``HOROVOD_TIMELINE_MARK_CYCLES=1``), taken
from rank 0's run directory on its node. Its writer thread spins, so on an emulated node take it
with rank 0's group unthrottled: the end of a gradient's negotiation (every rank has asked for it)
is then the emulated ranks' time.

Per training step (after ``--skip`` of warm-up), for the largest gradient (LeNet's Dense kernel)
and the first layer's kernel (``--last``, gradient index 0, the end of backprop): how long after
the big one the last gradient was ready everywhere, the big allreduce's wait and duration, how
much of it fell before the last gradient was ready, what the small gradients' allreduce added,
and the step. Medians, in milliseconds, as one JSON line, with the mean step, how long the big
gradient took to be negotiated (from the first rank's request to the last's), and the steps'
lengths in 10 ms bins.

Horovod sees a request only at a turn of its cycle, so at a long cycle every figure here is counted
in whole cycles: at 100 ms, steps of 300 ms and 400 ms and a median negotiation of 99 ms meant the
big allreduce started about one cycle after the first rank's request, and a median step hid the
long ones (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any


def load(path: Path) -> list[dict]:
    """The events; a file cut off mid-write (Horovod appends as it goes) loses only its last one."""
    text = path.read_text().rstrip().rstrip(",")
    if not text.endswith("]"):
        text = text[: text.rfind("}") + 1] + "]"
    return json.loads(text)


def intervals(events: list[dict]) -> dict[int, dict[str, list[tuple[int, int]]]]:
    """Per gradient index: its NEGOTIATE_ALLREDUCE and ALLREDUCE intervals (microseconds), in order."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and "name" in e.get("args", {})}
    index = {pid: int(m.group(1)) for pid, name in names.items() if (m := re.search(r"grads_(\d+)", name))}
    found: dict[int, dict[str, list[tuple[int, int]]]] = {}
    stacks: dict[int, list[tuple[str, int]]] = {}
    for e in events:
        pid = e.get("pid")
        if pid is None or pid not in index or e.get("ph") not in ("B", "E"):
            continue
        stack = stacks.setdefault(pid, [])
        if e["ph"] == "B":
            stack.append((e["name"], e["ts"]))
            continue
        name, start = stack.pop()  # sub-activities (fusion-buffer copies, the collective) nest inside
        if name in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE"):
            found.setdefault(index[pid], {}).setdefault(name, []).append((start, e["ts"]))
    return found


def analyse(events: list[dict], big: int, last: int, skip: int) -> dict:
    g = intervals(events)
    ready_big, ready_last = g[big]["NEGOTIATE_ALLREDUCE"], g[last]["NEGOTIATE_ALLREDUCE"]
    ar_big, ar_last = g[big]["ALLREDUCE"], g[last]["ALLREDUCE"]
    steps = min(len(ready_big), len(ready_last), len(ar_big), len(ar_last))
    rows = []
    negotiate = [(e - b) / 1e3 for b, e in ready_big[skip:steps - 1]]
    for s in range(skip, steps - 1):
        rb, rl = ready_big[s][1], ready_last[s][1]
        (b0, b1), (_, l1) = ar_big[s], ar_last[s]
        rows.append({
            "last_ready_after_big_ms": (rl - rb) / 1e3,
            "big_wait_ms": (b0 - rb) / 1e3,
            "big_allreduce_ms": (b1 - b0) / 1e3,
            "big_hidden_ms": max(0, min(b1, rl) - max(b0, rb)) / 1e3,
            "small_allreduce_after_ready_ms": (l1 - rl) / 1e3,
            "step_ms": (ready_big[s + 1][1] - rb) / 1e3,
        })
    if not rows:
        raise SystemExit(f"only {steps} steps in the timeline: nothing left after skipping {skip}")
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}
    out["step_ms_mean"] = round(statistics.mean(r["step_ms"] for r in rows), 1)
    out["big_negotiation_ms"] = round(statistics.median(negotiate), 1)
    out["step_ms_bins"] = dict(sorted(Counter(round(r["step_ms"], -1) for r in rows).items()))
    out["steps"] = len(rows)
    out["big_done_before_last_ready"] = sum(r["big_hidden_ms"] >= r["big_allreduce_ms"] - 1 for r in rows)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.timeline", description=__doc__)
    p.add_argument("file", type=Path)
    p.add_argument("--big", type=int, default=4, help="gradient index of the big tensor (LeNet's Dense kernel: 4)")
    p.add_argument("--last", type=int, default=0, help="gradient index that backprop reaches last (the first layer's kernel: 0)")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    args = p.parse_args(argv)
    print(json.dumps(analyse(load(args.file), args.big, args.last, args.skip)))


if __name__ == "__main__":
    main()
