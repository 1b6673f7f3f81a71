"""Rank 1 leaves after the first step while rank 0 keeps training (test fixture)."""

import sys

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
for step in range(1000):
    hvd.allreduce(tf.constant(1.0), name=f"grad.{step}")
    if hvd.rank() == 1:
        sys.exit(0)
