"""The LeNet job's first execution traced as edgetrain traces it, then as Keras and Horovod would:
``python -m lab.first_step`` prints one JSON line per way (Horovod at size 1, one process).

For each: how often Keras traced its train step, which modules AutoGraph converted, and the output
layer's bias after 16 steps from the same seed, which every weight's update reaches (the ops must
be the same either way).
"""

from __future__ import annotations

import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.impl import api as autograph_api

from edgetrain import tracing
from edgetrain.rank.jobs import lenet

converted: collections.Counter = collections.Counter()
_convert = autograph_api._convert_actual


def _watched(entity, program_ctx):
    converted[getattr(entity, "__module__", "?").split(".")[0]] += 1
    return _convert(entity, program_ctx)


autograph_api._convert_actual = _watched


def first_execution(edgetrain_way: bool) -> dict:
    tf.keras.utils.set_random_seed(1)
    converted.clear()
    rng = np.random.default_rng(0)
    x, y = rng.random((16 * 64, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 16 * 64)
    net = lenet.model({})
    opt = hvd.DistributedOptimizer(lenet.optimizer(0.001))
    if edgetrain_way:
        tracing.allreduce_without_autograph(opt)
    net.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"], steps_per_execution=8)
    opt.build(net.trainable_variables)
    if edgetrain_way:
        tracing.build_metrics(net, x, y)
    traces = 0
    train_step = net.train_step

    def counted(data):
        nonlocal traces
        traces += 1
        return train_step(data)

    net.train_step = counted
    net.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0)
    return {"edgetrain": edgetrain_way, "traces": traces, "converted": dict(converted),
            "weights": [w.tolist() for w in net.get_weights()[-1:]]}


def main() -> None:
    hvd.init()
    tf.config.experimental.enable_op_determinism()
    for edgetrain_way in (True, False):  # AutoGraph caches what it converted: edgetrain's way first
        print(json.dumps(first_execution(edgetrain_way)), flush=True)


if __name__ == "__main__":
    main()
