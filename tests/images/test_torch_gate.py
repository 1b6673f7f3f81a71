"""The Cortex-A72 gate (images/edgetrain-torch-gate), the code every image build's check runs on its torch.

On this machine's torch it must pass in every suite. With ``-m arm64`` it runs on PyPI's aarch64
torch wheels in a Debian arm64 root under qemu's cortex-a72 model: its negative control must die
there, 2.8.0 and 2.9.1 must pass, and 2.10.0 (mimalloc built with LSE atomics, pytorch#174344) must
die with SIGILL - under the cortex-a72 model only, not under qemu's ``max`` CPU, so that death is
the missing instruction and the gate is seen failing on a real bad build. The root, the wheels and
each torch installed are kept in edgetrain's cache (``torch-gate/``); a first run fetches them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from edgetrain.controller import images
from edgetrain.controller.inventory import project_root
from tests.conftest import summarize

GATE = project_root() / "images" / "edgetrain-torch-gate"
ARM64 = images.TARGETS["arm64"]
PLATFORM = ["--platform", "manylinux_2_28_aarch64", "--python-version", ARM64.python, "--only-binary=:all:"]
# What torch needs, named rather than resolved: pip evaluates markers for this x86_64 machine, and
# torch's say `platform_machine == "x86_64"` for NVIDIA's CUDA packages, which an aarch64 torch
# does not take. sympy 1.14 needs mpmath < 1.4.
TORCH_NEEDS = ["filelock", "typing-extensions", "sympy<1.15", "mpmath<1.4", "networkx", "jinja2", "markupsafe", "fsspec", "numpy"]
PASSED = "model's convolution forward and backward ok, two-process Gloo allreduce ok, torch.jit.script and torch.jit.trace ok"
CONTROL_DIED = "an ldaddal died with SIGILL"


def test_the_gate_passes_this_machines_torch():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(GATE)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("negative control: "), lines
    assert PASSED in lines[-1], lines


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, timeout=1800)


@pytest.fixture(scope="module")
def gate_dir(cache_dir) -> Path:
    return cache_dir / "torch-gate"


@pytest.fixture(scope="module")
def arm64_root(gate_dir) -> Path:
    """A Debian arm64 root with python3 (debootstrap through qemu, about 2-5 min the first time)."""
    root = gate_dir / f"{images.DEBIAN_SUITE}-arm64"
    if not root.exists():
        images.require_emulation(ARM64)
        gate_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=gate_dir) as tmp:
            mirror = os.environ.get("EDGETRAIN_DEBIAN_MIRROR", images.DEFAULT_DEBIAN_MIRROR)
            subprocess.run(["debootstrap", "--variant=minbase", "--arch=arm64", "--include=python3", images.DEBIAN_SUITE,
                            f"{tmp}/root", mirror], check=True, capture_output=True, timeout=3600)
            os.rename(f"{tmp}/root", root)
    return root


def installed_torch(version: str, root: Path, gate_dir: Path) -> str:
    """The folder, inside the root, holding PyPI's aarch64 torch ``version`` and what it needs."""
    wheels = gate_dir / "wheels"
    if not list(wheels.glob(f"torch-{version}-*.whl")):
        pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), f"torch=={version}")
    needs = wheels / "torch-needs.txt"
    if not needs.exists() or needs.read_text().split() != TORCH_NEEDS:
        pip("download", "--no-deps", *PLATFORM, "-d", str(wheels), *TORCH_NEEDS)
        needs.write_text("\n".join(TORCH_NEEDS) + "\n")
    inside = f"/opt/torch-{version}"
    target = root / inside.lstrip("/")
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        pip("install", "--no-index", "--find-links", str(wheels), "--no-deps", *PLATFORM, "--target", str(partial),
            f"torch=={version}", *TORCH_NEEDS)
        partial.rename(target)
    return inside


def run_gate(root: Path, torch_dir: str, cpu: str) -> tuple[subprocess.CompletedProcess, float]:
    """The gate in the root under qemu's ``cpu`` model, with only that torch on its path; /proc and
    /sys mounted in a mount namespace of its own, so nothing stays mounted after it."""
    shutil.copy(GATE, root / "opt" / GATE.name)
    script = ('ulimit -c 0 && mount -t proc proc "$1/proc" && mount -t sysfs sysfs "$1/sys" && '
              f'exec chroot "$1" env -i PATH=/usr/bin:/bin QEMU_CPU={cpu} PYTHONPATH={torch_dir} python3 /opt/{GATE.name}')
    start = time.monotonic()
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(root)], capture_output=True, text=True, timeout=1800)
    return proc, time.monotonic() - start


@pytest.mark.arm64
@pytest.mark.slow
@pytest.mark.parametrize(("version", "cpu", "passes"), [
    ("2.8.0", "cortex-a72", True),
    ("2.9.1", "cortex-a72", True),
    ("2.10.0", "cortex-a72", False),
    ("2.10.0", "max", True),
])
def test_pypi_torch_under_the_cortex_a72_gate(version, cpu, passes, arm64_root, gate_dir):
    proc, seconds = run_gate(arm64_root, installed_torch(version, arm64_root, gate_dir), cpu)
    print(proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    ended = "passed" if proc.returncode == 0 else f"exit status {proc.returncode}"
    summarize("torch under the Cortex-A72 gate", f"torch {version} under qemu -cpu {cpu}: {ended} in {seconds:.0f} s; "
                                                  f"last line: {lines[-1] if lines else '(none)'}")
    # The control comes first: under cortex-a72 the LSE instruction dies, under max it runs.
    assert lines and (CONTROL_DIED in lines[0]) == (cpu == "cortex-a72"), proc.stdout + proc.stderr
    if passes:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert lines[-1].startswith(f"torch {version}"), lines
        assert lines[-1].endswith(f"conv + linear + scaled_dot_product_attention {PASSED}"), lines
    else:
        assert proc.returncode == -signal.SIGILL, proc.stdout + proc.stderr
        assert not any(PASSED in line for line in lines), lines
