"""Raises on one rank (--rank, default 1) once every rank is up (test fixture)."""

import argparse
import time

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
args = parser.parse_args()
hvd.init()
if hvd.rank() == args.rank:
    raise ValueError(f"bad batch on rank {args.rank}")
time.sleep(60)
