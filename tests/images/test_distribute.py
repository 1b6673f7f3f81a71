"""`edgetrain images distribute|list` against a second, real Docker engine reached over real ssh.

The node is this machine's loopback: its own sshd on 127.0.0.1 (own host key, own client key,
own port) whose sessions get DOCKER_HOST pointing at a second private engine, so the image really
travels `docker save | ssh | docker load` between two engines.
"""

from __future__ import annotations

import io
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgetrain.controller import images, inventory
from edgetrain.controller.remote import ssh_command
from edgetrain.shared.errors import EdgetrainError
from lab import docker_engine
from tests.conftest import edgetrain

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@dataclass
class SshNode:
    inventory: Path
    engine: docker_engine.DockerEngine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def node(engine, tmp_path_factory) -> Iterator[SshNode]:
    if docker_engine.why_unavailable():
        pytest.skip(docker_engine.why_unavailable())
    d = tmp_path_factory.mktemp("node")
    second = docker_engine.start()
    sshd = None
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        port = _free_port()
        (d / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
            f"AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\n"
            f"SetEnv DOCKER_HOST={second.host}\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stderr=(d / "sshd.log").open("wb"))
        user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
        (d / "hosts.yml").write_text(
            "cluster:\n  children:\n    head:\n      hosts:\n        node1:\n"
            f"          ansible_host: 127.0.0.1\n          ansible_port: {port}\n          ansible_user: {user}\n"
            f"          ansible_ssh_private_key_file: {d}/client_key\n"
            f"          ansible_ssh_common_args: -o UserKnownHostsFile={d}/known_hosts -o StrictHostKeyChecking=accept-new\n"
            "          edgetrain_arch: x86_64\n          edgetrain_runtime: docker\n          edgetrain_slots: 2\n"
        )
        deadline = time.monotonic() + 20
        host = inventory.load(d / "hosts.yml").hosts[0]
        while subprocess.run([*ssh_command(host), "true"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline and sshd.poll() is None, (d / "sshd.log").read_text()
            time.sleep(0.3)
        yield SshNode(d / "hosts.yml", second)
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(timeout=10)
        second.stop()


def test_distribute_loads_then_skips_and_list_shows_it(amd64_image, node):
    inv = inventory.load(node.inventory)
    assert node.engine.docker("image", "inspect", amd64_image.tag, check=False).returncode != 0

    first = images.distribute(inv, log=lambda _: None)
    assert [(s.host, s.tag, s.image_id, s.loaded) for s in first] == [("node1", amd64_image.tag, amd64_image.image_id, True)]
    on_node = node.engine.docker("image", "inspect", "--format", "{{.Id}}", amd64_image.tag).stdout.strip()
    assert on_node == amd64_image.image_id

    # The real CLI, a second time: nothing to send.
    proc = edgetrain("images", "distribute", "-i", str(node.inventory))
    assert proc.returncode == 0, proc.stderr
    assert "already present" in proc.stdout

    rows = images.list_images(inv)
    assert [(r.host, r.tag, r.image_id, r.arch) for r in rows] == [("node1", amd64_image.tag, amd64_image.image_id, "amd64")]
    proc = edgetrain("images", "list", "-i", str(node.inventory))
    assert proc.returncode == 0, proc.stderr
    assert "node1" in proc.stdout and amd64_image.tag in proc.stdout and amd64_image.image_id[7:19] in proc.stdout


def test_an_image_built_on_one_the_node_holds_is_sent_without_the_layers_it_shares(amd64_image, node, tmp_path):
    """What `images build --requirements` makes: a few layers on top of the image the node has. Only
    those travel; docker load still ends with the whole image, its ID verified."""
    images.distribute(inventory.load(node.inventory), log=lambda _: None)  # the base, if an earlier test did not send it
    (tmp_path / "extra.txt").write_text("a project's own file\n")
    (tmp_path / "Dockerfile").write_text(f"FROM {amd64_image.tag}\nCOPY extra.txt /opt/extra.txt\n")
    tag = f"{amd64_image.tag}-derived-test"
    images.engine_build(tmp_path, tag=tag, platform="linux/amd64", log=None, output=io.StringIO())
    text = node.inventory.read_text().replace("edgetrain_arch: x86_64", f"edgetrain_arch: x86_64\n          edgetrain_image: {tag}")
    (tmp_path / "hosts.yml").write_text(text)
    said: list[str] = []
    try:
        (shipped,) = images.distribute(inventory.load(tmp_path / "hosts.yml"), log=said.append)
        base_layers = len(images.inspect_image(amd64_image.tag)["RootFS"]["Layers"])
        assert shipped.loaded and f"({base_layers} of its {base_layers + 1} layers already there)" in said[0], said
        sent = float(said[-1].split("loaded (")[1].split(" MB sent")[0].replace(",", ""))
        assert sent < 1, said  # the base is 1.8 GB
        on_node = node.engine.docker("run", "--rm", "--network", "none", tag, "cat", "/opt/extra.txt").stdout
        assert on_node == "a project's own file\n"
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)
        node.engine.docker("image", "rm", tag, check=False)


def test_distribute_refuses_an_image_of_the_wrong_arch(amd64_image, node, tmp_path):
    # A Pi in the inventory whose image tag points at the amd64 build must not receive it.
    text = node.inventory.read_text().replace("edgetrain_arch: x86_64", f"edgetrain_arch: aarch64\n          edgetrain_image: {amd64_image.tag}")
    (tmp_path / "hosts.yml").write_text(text)
    with pytest.raises(EdgetrainError, match="is amd64 but node1 is aarch64"):
        images.distribute(inventory.load(tmp_path / "hosts.yml"), log=lambda _: None)
