"""Horovod allreduce between the ranks of one launch, as training does it: `edgetrain bench`'s probe.

``mpirun ... python -m edgetrain.rank.worker --module edgetrain.rank.allreduce -- --bytes 6520000``: every rank
allreduces a float32 tensor of that size (and an 8-byte one, for latency) through Horovod, so the
figures include its background thread, its negotiation and MPICH's algorithm on these links and
CPUs (Gloo's or MPICH's, whichever the launch gave Horovod). Rank 0 reports, as an ``allreduce`` event: wall seconds per operation (the slowest rank's)
and the CPU seconds a rank's process spent per operation (all its threads: the polling included),
the busiest rank's; and the CPU a rank's process spends per second between operations, at the
training's cycle (each turn of Horovod's cycle coordinates with every rank, sent or not).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod.tensorflow as hvd
import tensorflow as tf

from edgetrain.callbacks import events
from edgetrain.rank import allreduce_probe

# Horovod starts a collective only at a turn of its cycle, and CPU nodes get long cycles: back to
# back, the allreduces would time the cycle, not the transfer. The probe runs a short cycle of its
# own and reports the launch's, whose wait the prediction adds (bench.Allreduce.per_update).
PROBE_CYCLE_MS = 5
HOROVOD_DEFAULT_CYCLE_MS = 1.0


def _time(tensor: tf.Tensor, iters: int, compression, name: str) -> tuple[float, float]:
    """(wall, CPU) seconds per allreduce: the slowest rank's wall time and the busiest rank's CPU."""
    for i in range(2):  # connection setup, buffer registration, Horovod's response cache
        hvd.allreduce(tensor, op=hvd.Sum, compression=compression, name=f"{name}.warm{i}")
    hvd.allreduce(tf.constant(0.0), name=f"{name}.barrier")
    wall, cpu = time.perf_counter(), allreduce_probe.cpu_seconds()
    for _ in range(iters):
        hvd.allreduce(tensor, op=hvd.Sum, compression=compression, name=name)
    wall, cpu = (time.perf_counter() - wall) / iters, (allreduce_probe.cpu_seconds() - cpu) / iters
    worst = hvd.allreduce(tf.constant([wall, cpu], dtype=tf.float64), op=hvd.Max, name=f"{name}.times")
    return float(worst[0]), float(worst[1])


def main(argv: list[str] | None = None) -> None:
    args = allreduce_probe.parse("edgetrain.rank.allreduce", argv, "compress to float16 on the wire, as --fp16-allreduce does")
    cycle_ms = float(os.environ.get("HOROVOD_CYCLE_TIME", HOROVOD_DEFAULT_CYCLE_MS))
    os.environ["HOROVOD_CYCLE_TIME"] = str(PROBE_CYCLE_MS)
    hvd.init()
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    grad = tf.ones([max(1, args.bytes // 4)], dtype=tf.float32)
    wall, cpu = _time(grad, args.iters, compression, "edgetrain.bench.gradient")
    small_wall, _ = _time(tf.ones([2], dtype=tf.float32), 50, hvd.Compression.none, "edgetrain.controller.bench.latency")
    idle = allreduce_probe.idle_cpu_per_second(lambda: hvd.allreduce(tf.constant(0.0), name="edgetrain.bench.idle"))
    idle = float(hvd.allreduce(tf.constant(idle, dtype=tf.float64), op=hvd.Max, name="edgetrain.bench.idle.max"))
    # Measured at the probe's cycle. Gloo blocks while a turn waits for the other ranks, so every
    # turn costs about the same CPU and the training's cycle pays it (probe / training cycle) times
    # as often; MPI polls while it waits, so its CPU follows the time spent waiting, not the turns.
    if hvd.gloo_enabled():
        idle *= PROBE_CYCLE_MS / cycle_ms
    check = hvd.allreduce(tf.ones([4]), op=hvd.Sum, name="edgetrain.bench.check")
    if not bool(tf.reduce_all(check == hvd.size())):
        raise SystemExit(f"allreduce returned {check.numpy()}, expected {hvd.size()} everywhere")
    events().emit("allreduce", ranks=hvd.size(), bytes=args.bytes, fp16=args.fp16, iters=args.iters,
                  seconds=wall, cpu_seconds=cpu, latency_seconds=small_wall, transport="gloo" if hvd.gloo_enabled() else "mpi", cycle_seconds=cycle_ms / 1e3,
                  idle_cpu_per_second=idle)


if __name__ == "__main__":
    main()
