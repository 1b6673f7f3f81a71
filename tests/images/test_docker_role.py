"""The docker role's NVIDIA path on a gpu host, run for real with ansible-playbook against this
machine (connection local, no GPU): the driver refusal, the daemon.json runtime entry, idempotence,
--check, and where the container toolkit comes from.

Everything the role would change on the machine itself is pointed into a temp dir: daemon.json
(docker_daemon_config_path), the toolkit's binaries and nvidia-smi (scripted, answering with the
captured H100 values), the archive stage directory. docker_packages is empty and the engine is
neither restarted nor asked, so no package is installed and no service touched; the archive install
itself (apt-get on the machine) is only exercised in --check.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.playbook import Playbook, Result

ROOT = Path(__file__).resolve().parents[2]
# The role's query, answered as the captured H100 server answers it (tests/unit/test_gpu.py).
SMI_ANSWER = "0, NVIDIA H100 80GB HBM3, 580.159.04"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class GpuHost:
    """A gpu-group inventory host that is this machine, with its driver and toolkit scripted in a temp dir."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.bin = d / "bin"
        self.daemon_json = d / "etc/docker/daemon.json"
        self.stage = d / "stage"
        self.archives = d / "controller-archives"
        self.archives.mkdir(parents=True)
        (d / "hosts.yml").write_text(
            "cluster:\n  children:\n    gpu:\n      hosts:\n        gpu1:\n"
            "          ansible_connection: local\n"
            f"          ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n"
        )
        (d / "play.yml").write_text(
            "---\n- name: Docker role on a scripted gpu host\n  hosts: gpu\n  gather_facts: false\n  roles:\n    - docker\n"
        )
        self.vars = {
            "docker_packages": [],
            "docker_users": [],
            "docker_manage_service": False,
            "docker_verify_engine": False,
            "docker_daemon_config_path": str(self.daemon_json),
            "docker_nvidia_smi": str(self.bin / "nvidia-smi"),
            "docker_nvidia_runtime_binary": str(self.bin / "nvidia-container-runtime"),
            "docker_nvidia_hook_binary": str(self.bin / "nvidia-container-runtime-hook"),
            "docker_nvidia_toolkit_source": "none",
            "docker_nvidia_archive_dir": str(self.archives),
            "docker_nvidia_archive_stage_dir": str(self.stage),
        }

    def driver(self, ok: bool = True) -> None:
        if ok:
            script(self.bin / "nvidia-smi", f'echo "$@" >> {self.d}/nvidia-smi.args\necho "{SMI_ANSWER}"')
        else:
            script(self.bin / "nvidia-smi", f'echo "{NO_DRIVER}"\nexit 9')

    def toolkit(self) -> None:
        script(self.bin / "nvidia-container-runtime", "exit 0")
        script(self.bin / "nvidia-container-runtime-hook", "exit 0")

    def run(self, *args: str, **extra) -> Result:
        varfile = self.d / "vars.json"
        varfile.write_text(json.dumps({**self.vars, **extra}))
        return Playbook(ROOT, str(self.d / "hosts.yml")).run(str(self.d / "play.yml"), "-e", f"@{varfile}", *args, timeout=300)


@pytest.fixture
def host(tmp_path) -> GpuHost:
    return GpuHost(tmp_path)


def flat(result: Result) -> str:
    return " ".join(result.output.split())


def task_status(result: Result, name: str) -> str:
    """ok, changed, skipping or fatal: what the play said right after the task's header."""
    lines = result.output.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"TASK [docker : {name}]"))
    return next(line.split(":", 1)[0] for line in lines[i + 1:] if line.startswith(("ok:", "changed:", "skipping:", "fatal:")))


def test_gpu_host_without_nvidia_smi_is_refused_before_any_change(host):
    result = host.run()
    assert result.returncode != 0 and result.recap["gpu1"]["failed"] == 1, result.output[-3000:]
    assert f"docker: gpu1 is in group gpu but its NVIDIA driver does not answer ({host.bin}/nvidia-smi: " in flat(result)
    assert "Install and load the NVIDIA driver until nvidia-smi lists the GPUs, or move the host out of group gpu." in flat(result)
    assert not host.daemon_json.exists()


def test_gpu_host_whose_driver_is_not_loaded_is_refused(host):
    host.driver(ok=False)
    result = host.run()
    assert result.returncode != 0
    assert f"its NVIDIA driver does not answer ({host.bin}/nvidia-smi: {NO_DRIVER})" in flat(result)
    assert not host.daemon_json.exists()


def test_runtime_entry_is_written_once_then_nothing_changes(host):
    host.driver()
    host.toolkit()
    first = host.run().check()
    assert first.changed()["gpu1"] >= 1
    # The role asked the driver exactly this, and reported its answer.
    assert (host.d / "nvidia-smi.args").read_text().split("\n")[0] == "--query-gpu=index,name,driver_version --format=csv,noheader"
    assert f"docker: gpu1: {SMI_ANSWER}" in first.output
    config = json.loads(host.daemon_json.read_text())
    assert config == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "3"},
        "runtimes": {"nvidia": {"path": str(host.bin / "nvidia-container-runtime"), "runtimeArgs": []}},
    }
    again = host.run().check()
    assert again.changed() == {"gpu1": 0}, again.changed_tasks()
    # Asking for nvidia as the default runtime is one more change, then stable again.
    default = host.run(docker_nvidia_default_runtime=True).check()
    assert default.changed_tasks() == ["docker : Engine configuration: gpu1"]
    assert json.loads(host.daemon_json.read_text())["default-runtime"] == "nvidia"
    assert host.run(docker_nvidia_default_runtime=True).check().changed() == {"gpu1": 0}


def test_check_mode_changes_nothing_and_its_handler_does_not_fail(host):
    host.driver()
    host.toolkit()
    # A node where the engine is not installed yet: no such service to start or restart.
    result = host.run("--check", docker_manage_service=True, docker_service_name="edgetrain-no-such-service").check()
    assert "docker : Engine configuration: gpu1" in result.changed_tasks()
    assert "RUNNING HANDLER [docker : Restart docker]" in result.output
    assert task_status(result, "Engine running and enabled") == "fatal" and result.recap["gpu1"]["ignored"] == 2
    assert not host.daemon_json.exists()


def test_missing_toolkit_with_source_none_is_refused(host):
    host.driver()
    result = host.run()
    assert result.returncode != 0
    assert (f"docker: gpu1 has no {host.bin}/nvidia-container-runtime and {host.bin}/nvidia-container-runtime-hook on PATH "
            "(toolkit source: none)") in flat(result)
    assert not host.daemon_json.exists()


def test_archive_source_refuses_an_empty_archive_directory(host):
    host.driver()
    result = host.run(docker_nvidia_toolkit_source="archive")
    assert result.returncode != 0
    assert f"docker: no .deb files in {host.archives} on the controller for gpu1." in flat(result)
    assert not host.stage.exists()


def test_archive_source_stages_the_controllers_debs_in_check_mode(host):
    host.driver()
    for name in ("libnvidia-container1_1.17.8-1_amd64.deb", "nvidia-container-toolkit_1.17.8-1_amd64.deb"):
        (host.archives / name).write_bytes(b"!<arch>\n")  # never installed: --check
    result = host.run("--check", docker_nvidia_toolkit_source="archive").check()
    changed = result.changed_tasks()
    assert "docker : Stage directory for the toolkit archives: gpu1" in changed
    assert changed.count("docker : Copy the toolkit archives to the node: gpu1") == 2
    assert task_status(result, "Install the NVIDIA container toolkit from the staged archives") == "skipping"
    assert not host.stage.exists() and not host.daemon_json.exists()


def test_unknown_toolkit_source_is_refused(host):
    host.driver()
    result = host.run(docker_nvidia_toolkit_source="ppa")
    assert result.returncode != 0
    assert "docker: docker_nvidia_toolkit_source is 'ppa'; use one of repository, archive, none" in flat(result)
