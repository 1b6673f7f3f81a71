"""Training images: offline wheelhouse, debootstrap base, build, and distribution to the nodes.

Builds never reach a Python package index: the controller downloads a wheelhouse for the target
platform (``pip download --platform``), and the image installs from it with ``--no-index``. Only
the distribution's package mirror is used inside the build. Nodes receive images over SSH
(``docker save | ssh node docker load``), so no registry is needed anywhere.

The controller's own engine (``DOCKER_HOST`` or the default socket) is driven through the Docker
SDK for Python: builds (their log streamed, each step reported as progress), inspection, labels and
``save``. Nodes are reached with ssh exactly as Ansible reaches them and run the ``docker`` CLI
there: the SDK's ``ssh://`` transport cannot take the inventory's per-host key, port and ssh
arguments (docs/images.md).

One module per job: ``targets`` (the flavours, their pins, tags and labels), ``wheelhouse``,
``local_engine`` (this machine's engine), ``base`` (the debootstrap base), ``image_build``,
``catalog`` (what the nodes hold) and ``distribution``. Callers use the names below, from
``edgetrain.controller.images``; a test that replaces a function patches the module that calls it.
"""

from edgetrain.controller.images.targets import (
    LABELLED_PACKAGES, PACKAGE_LABEL, TARGETS, Target, constraints_file, default_cache_dir, image_for, packages,
    pinned_versions, target, target_constraints, target_for,
)
from edgetrain.controller.images.wheelhouse import BUILD_REQUIREMENTS, image_requirements, prepare_wheelhouse, wheelhouse_requirements
from edgetrain.controller.images.local_engine import engine, engine_build, image_labels, inspect_image, local_image_id
from edgetrain.controller.images.base import DEBIAN_SUITE, DEFAULT_DEBIAN_MIRROR, base_tag, make_base, require_emulation
from edgetrain.controller.images.image_build import BuildResult, build
from edgetrain.controller.images.catalog import list_images, node_docker
from edgetrain.controller.images.distribution import copy_without, distribute, layers_held

