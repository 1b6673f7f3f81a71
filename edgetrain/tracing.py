"""The first step's tracing: what it costs a Keras job under Horovod, and the two parts of it that buy nothing.

Before its first step Keras traces its training function into a graph: Python that runs once, on
one core, while every rank waits. LeNet at 8 steps per execution spent 2.3 s of this machine's CPU
more on its first execution than on a later one - 13 s of an emulated Pi 4's time, at every number
of nodes, before the first image of the time to accuracy (docs/scaling-history.md). Most of it was two things:

- Horovod wraps its gradient allreduce in a ``tf.function`` with AutoGraph on, so the first trace
  converts Horovod's Python, statement by statement, into graph code (about 1.2 s). That Python
  has no control flow on tensors to convert: it calls ``tf.cond`` itself.
- Keras creates its metrics' variables inside that first trace, and a ``tf.function`` that creates
  variables is traced a second time; with several steps per execution AutoGraph traces the loop's
  body twice in each, so the step was traced four times instead of two.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def allreduce_without_autograph(optimizer: tf.keras.optimizers.Optimizer) -> None:
    """Horovod's Keras ``DistributedOptimizer`` with its allreduce traced as plain Python: the same ops."""
    fn = optimizer._allreduce_grads
    if not hasattr(fn, "python_function"):
        return  # Horovod built it outside eager mode: plain Python already
    plain = tf.function(fn.python_function, autograph=False)
    optimizer._allreduce_grads = plain
    helper = getattr(optimizer, "_agg_helper", None)
    if helper is not None:  # gradient accumulation took the function when the optimizer was made
        helper.allreduce_grads = plain


def build_metrics(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> None:
    """Creates the compiled metrics' variables from one example, then zeroes them (as ``fit`` does
    at every epoch), so that the first trace creates none and is not repeated."""
    if model.compiled_metrics is None:
        return
    model.compiled_metrics.update_state(tf.constant(y[:1]), model(x[:1], training=False))
    model.reset_metrics()
