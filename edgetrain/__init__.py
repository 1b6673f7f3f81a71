"""edgetrain: data-parallel training on edge clusters with MPICH, Horovod and TensorFlow."""

__version__ = "0.1.0"
