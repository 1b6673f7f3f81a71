"""Is XLA worth it for a built-in job? ``python -m lab.xla_step [--job lenet] [--threads N]``.

Keras' ``jit_compile=True`` cannot compile a step that holds Horovod's allreduce (it has no XLA
CPU kernel), so the only XLA a Horovod job can use is on the gradient computation alone, with the
allreduce and the update outside it. This times that against the same step without XLA, one
process, no Horovod, on synthetic batches of the job's size, interleaved ``--rounds`` times, and
prints the img/s of each as one JSON line. ``--threads`` sets TensorFlow's intra-op threads
(0: TensorFlow's default, every core).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from edgetrain.shared.jobs import get as get_job


def compiled_step(job, options: dict, xla: bool):
    net, opt = job.model(options), job.optimizer(job.BASE_LR)
    opt.build(net.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function(jit_compile=xla)
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        return loss, tape.gradient(loss, net.trainable_variables)

    @tf.function
    def step(x, y):
        loss, grads = gradients(x, y)  # where Horovod's allreduce of grads would go
        opt.apply_gradients(zip(grads, net.trainable_variables, strict=True))
        return loss

    return step


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.xla_step", description=__doc__)
    p.add_argument("--job", default="lenet")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    spec = get_job(args.job)
    job = spec.load()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((spec.batch_size, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, spec.batch_size))
    steps = {"plain": compiled_step(job, spec.options, False), "xla_gradients": compiled_step(job, spec.options, True)}
    for step in steps.values():  # tracing and XLA's compilation stay out of the timing
        for _ in range(20):
            step(x, y)
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = step(x, y)
            float(loss)  # waits for the last step
            rates[name].append(round(args.steps * spec.batch_size / (time.perf_counter() - start)))
    print(json.dumps({"job": args.job, "threads": args.threads, "img_per_sec": rates}))


if __name__ == "__main__":
    main()
