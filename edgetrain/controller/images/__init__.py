"""Training images (moved into a package; the next commit cuts local_engine into a module per job)."""

from edgetrain.controller.images.local_engine import *  # noqa: F403
from edgetrain.controller.images.local_engine import __version__, _inspect, _require_emulation, _tar_stream  # noqa: F401
