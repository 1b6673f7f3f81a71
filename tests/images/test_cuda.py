"""Dockerfile.cuda: a real build where the NVIDIA CUDA base images are in the engine (no registry here)."""

from __future__ import annotations

import re
import subprocess

import pytest

from edgetrain import images
from tests.images.conftest import build_target

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def dockerfile_default(name: str) -> str:
    text = (images.project_root() / "images" / "Dockerfile.cuda").read_text()
    return re.search(rf"^ARG {name}=(\S+)$", text, re.MULTILINE).group(1)


def test_cuda_image_builds_with_nccl(engine, cache_dir):
    bases = [dockerfile_default("BASE_IMAGE"), dockerfile_default("RUNTIME_BASE_IMAGE")]
    missing = [b for b in bases if engine.docker("image", "inspect", b, check=False).returncode != 0]
    if missing:
        pytest.skip(f"CUDA base image(s) {', '.join(missing)} not in the Docker engine; docker load them to run this build")
    result = build_target("cuda", engine, cache_dir)
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", result.tag, "edgetrain-image-check", "--nccl"], capture_output=True, text=True)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    ops = proc.stdout.split("Available Tensor Operations:")[1].splitlines()
    assert "[X] NCCL" in [line.strip() for line in ops]
