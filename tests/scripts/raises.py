"""Raises on rank 1 once every rank is up (test fixture)."""

import time

import horovod.tensorflow as hvd

hvd.init()
if hvd.rank() == 1:
    raise ValueError("bad batch on rank 1")
time.sleep(60)
