"""Dockerfile.cuda. Static checks always (what the build compiles, that it installs offline, that the
runtime stage carries no compiler, that its labels match edgetrain.controller.gpu); the real offline build and
its in-image checks with ``-m cuda`` (`make test-cuda`; no GPU needed), next to the checks every
image gets in test_build.py.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from edgetrain.controller import gpu
from edgetrain.controller import images
from edgetrain.controller.inventory import project_root

DOCKERFILE = project_root() / "images" / "Dockerfile.cuda"


def stages() -> list[str]:
    """The Dockerfile's stages, each from its FROM line on, with continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    parts = re.split(r"^(?=FROM )", text, flags=re.MULTILINE)
    return [p for p in parts if p.startswith("FROM ")]


def instructions(stage: str, keyword: str) -> list[str]:
    return [line for line in stage.splitlines() if line.startswith(keyword + " ")]


def test_two_stages_and_the_runtime_takes_only_the_venv():
    builder, runtime = stages()
    assert builder.startswith("FROM ${BASE_IMAGE} AS builder")
    assert runtime.startswith("FROM ${BASE_IMAGE}\n")
    assert [c for c in instructions(runtime, "COPY") if "--from" in c] == ["COPY --from=builder /opt/edgetrain /opt/edgetrain"]


def test_horovod_is_built_with_nccl_against_tensorflows_nccl():
    builder, _ = stages()
    (horovod,) = [r for r in instructions(builder, "RUN") if "pip wheel" in r and " horovod" in r]
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_NCCL_LINK=SHARED", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_TENSORFLOW=1",
                    "HOROVOD_CUDA_HOME=/usr", 'HOROVOD_NCCL_INCLUDE="$nccl/include"', 'HOROVOD_NCCL_LIB="$nccl/lib"',
                    "CXX=g++-11", 'HOROVOD_BUILD_CUDA_CC_LIST="$HOROVOD_BUILD_CUDA_CC_LIST"'):
        assert setting in horovod, setting
    assert 'nccl="$site/nvidia/nccl"' in horovod  # the nvidia-nccl-cu12 wheel TensorFlow brings
    assert re.search(r'^ARG HOROVOD_BUILD_CUDA_CC_LIST="70,75,80,86,89,90"$', builder, re.MULTILINE)
    # nvcc comes from Debian's non-free component, added to the base's sources in the builder only.
    assert 'ARG APT_COMPONENTS="main contrib non-free"' in builder
    (apt,) = [r for r in instructions(builder, "RUN") if "edgetrain-apt-install" in r]
    assert "nvidia-cuda-toolkit" in apt and "g++-11" in apt


def test_every_python_package_comes_from_the_wheelhouse():
    builder, runtime = stages()
    env = " ".join(instructions(builder, "ENV"))
    assert "PIP_NO_INDEX=1" in env and 'PIP_FIND_LINKS="/wheels /built /project"' in env
    assert "PIP_CONSTRAINT=/opt/edgetrain/constraints.txt" in env
    pip_runs = [r for r in instructions(builder, "RUN") if re.search(r"\bpip (install|wheel)\b", r)]
    assert len(pip_runs) == 4  # TensorFlow and build tools; Horovod; edgetrain and mpi4py; torch
    text = DOCKERFILE.read_text()
    # The ENV comes before any pip, and nothing names an index, a URL or a download.
    assert text.index("PIP_NO_INDEX=1") < text.index("pip install")
    for forbidden in ("--index-url", "--extra-index-url", "pip download", "http://", "https://", "curl ", "wget "):
        assert forbidden not in text, forbidden
    assert not re.search(r"\bpip\b", " ".join(instructions(runtime, "RUN")))


def test_torch_is_the_pinned_release_in_a_directory_of_its_own():
    # Its nvidia-*-cu12 wheels are other versions of TensorFlow's, at the same paths (nvidia/nccl/lib/libnccl.so.2).
    builder, runtime = stages()
    (torch,) = [r for r in instructions(builder, "RUN") if "pip install --target" in r]
    assert "pip install --target /opt/edgetrain/torch torch " in torch and "edgetrain-torch.pth" in torch
    # torch's preload of NVRTC and nvJitLink searches its own directory before the venv's (TensorFlow's
    # 12.2 ones), and the build stops if the line it changes is not there exactly once.
    assert """[ "$(grep -c '^    for path in sys.path:$' "$init")" = 1 ]""" in torch
    assert "for path in [os.path.dirname(os.path.dirname(__file__)), *sys.path]:" in torch
    # Its own pin, in place of constraints.txt's CPU-only builds for CPU nodes: PyPI's CUDA 12.8 build.
    cuda = images.TARGETS["cuda"]
    assert (images.pinned_versions(cuda)["torch"], cuda.torch_cuda) == ("2.9.1", "12.8")
    assert images.pinned_versions(images.TARGETS["amd64"])["torch"].endswith("+cpu") and not images.TARGETS["amd64"].torch
    (check,) = [r for r in instructions(runtime, "RUN") if "edgetrain-image-check" in r]
    assert '--torch "$TORCH_VERSION"' in check and 'org.edgetrain.torch.version="${TORCH_VERSION}"' in runtime
    # The CUDA of torch's build: checked by the build, labelled for the GPU preflight; no default,
    # so a build without images.build's argument fails its check instead of labelling a guess.
    assert '--torch-cuda "$TORCH_CUDA_VERSION"' in check and "ARG TORCH_CUDA_VERSION\n" in runtime
    assert f'{gpu.TORCH_CUDA_LABEL}="${{TORCH_CUDA_VERSION}}"' in runtime


def test_runtime_stage_installs_no_compiler():
    _, runtime = stages()
    (apt,) = [r for r in instructions(runtime, "RUN") if "edgetrain-apt-install" in r]
    packages = apt.split("edgetrain-apt-install", 1)[1].split("&&", 1)[0].split()
    assert packages == ["python3", "mpich", "openssh-server"]


def test_the_build_checks_nccl_and_cuda_and_labels_what_edgetrain_gpu_expects():
    _, runtime = stages()
    (check,) = [r for r in instructions(runtime, "RUN") if "edgetrain-image-check" in r]
    assert "--nccl" in check and '--cuda "$CUDA_VERSION"' in check
    assert f"ARG CUDA_VERSION={gpu.IMAGE_CUDA}" in runtime
    assert f'{gpu.CUDA_LABEL}="${{CUDA_VERSION}}"' in runtime
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in runtime  # nvidia-smi in a --gpus container (preflight)


def test_the_cuda_target_builds_from_the_debian_base():
    tgt = images.TARGETS["cuda"]
    assert (tgt.dockerfile, tgt.docker_arch, tgt.debootstrap_base) == ("Dockerfile.cuda", "amd64", True)
    assert tgt.tensorflow == ("tensorflow[and-cuda]",)


# --- the real build (opt-in: -m cuda) ---------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.docker
@pytest.mark.slow
def test_cuda_image_check_shows_nccl_and_loads_the_cuda_stack(cuda_built):
    cuda = images.TARGETS["cuda"]
    pins = images.pinned_versions(cuda)
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", cuda_built.tag, "edgetrain-image-check", "--nccl", "--cuda", gpu.IMAGE_CUDA,
         "--tensorflow", pins["tensorflow"], "--horovod", pins["horovod"], "--torch", pins["torch"], "--torch-cuda", cuda.torch_cuda],
        capture_output=True, text=True, timeout=600,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.strip() for line in proc.stdout.splitlines()]
    ops = lines[lines.index("Available Tensor Operations:") + 1:]
    assert ops[:5] == ["[X] NCCL", "[ ] DDL", "[ ] CCL", "[X] MPI", "[ ] Gloo"]
    stack = next(line for line in lines if line.startswith("TensorFlow built for CUDA"))
    assert stack == ("TensorFlow built for CUDA 12.2, cuDNN 8; CUDA runtime 12.2, cuDNN 8.9.4, NCCL 2.16.5; "
                     "7/7 CUDA libraries load without a driver")
    site = "/opt/edgetrain/lib/python3.11/site-packages"
    assert f"Horovod TensorFlow ops loaded: CUDA built True, NCCL built True, NCCL from {site}/nvidia/nccl/lib/libnccl.so.2" in lines
    assert any(line.endswith("CUDA kernels: nvcc 11.8, cc 70,75,80,86,89,90") for line in lines)
    # torch: its own CUDA 12.8 stack, every NVIDIA library from its own prefix, kernels for Hopper and Blackwell.
    own = "/opt/edgetrain/torch/nvidia"
    (built,) = [line for line in lines if line.startswith("torch built for CUDA")]
    assert re.fullmatch(rf"torch built for CUDA 12\.8, cuDNN 9\d+, NCCL 2\.27\.\d+; cuDNN from {own}/cudnn/lib/libcudnn\.so\.9; "
                        rf"(\d+) of \1 NVIDIA libraries from {own}; GPUs visible to torch: 0", built), built
    (archs,) = [line.split(": ", 1)[1].split() for line in lines if line.startswith("torch kernels for: ")]
    assert "sm_90" in archs and {"sm_100", "sm_120"} & set(archs), archs


@pytest.mark.cuda
@pytest.mark.docker
@pytest.mark.slow
def test_cuda_image_labels_its_cuda_for_the_preflight(cuda_built):
    labels = images.image_labels(cuda_built.tag)
    assert (labels[gpu.CUDA_LABEL], labels[gpu.TORCH_CUDA_LABEL]) == (gpu.IMAGE_CUDA, images.TARGETS["cuda"].torch_cuda)
