"""What the nodes' engines hold: each node reached with ssh exactly as Ansible reaches it (the
SDK's ``ssh://`` transport cannot take the inventory's per-host key, port and ssh arguments) and
running the ``docker`` CLI there."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass

from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.controller.remote import ssh_command
from edgetrain.controller.images.targets import image_for
from edgetrain.controller.images.tools import need_tool, run_tool


def node_docker(host: Host, args: list[str]) -> list[str]:
    """The command that runs ``docker ARGS`` against a node's own engine."""
    if host.is_local:
        return ["docker", *args]
    return [*ssh_command(host), shlex.join(["docker", *args])]


def node_image_id(host: Host, ref: str) -> str | None:
    proc = subprocess.run(node_docker(host, ["image", "inspect", "--format", "{{.Id}}", ref]), capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return proc.stdout.strip()
    if proc.returncode == 255 and not host.is_local:
        raise EdgetrainError(f"cannot reach {host.name} over ssh: {proc.stderr.strip()}", "check the address, user and key in the inventory")
    if "No such image" in proc.stderr or "No such object" in proc.stderr:
        return None
    raise EdgetrainError(f"docker on {host.name} failed: {proc.stderr.strip()}", "check the node's Docker engine (docker info)")


def docker_hosts(inventory: Inventory) -> list[Host]:
    hosts = [h for h in inventory.hosts if h.runtime == "docker"]
    if any(h.is_local for h in hosts):
        need_tool("docker", "docker.io")
    if any(not h.is_local for h in hosts):
        need_tool("ssh", "openssh-client")
    return hosts


@dataclass(frozen=True)
class NodeImage:
    host: str
    tag: str
    image_id: str
    arch: str
    created: str


def list_images(inventory: Inventory) -> list[NodeImage]:
    """edgetrain images present on every docker-runtime node."""
    rows = []
    for host in docker_hosts(inventory):
        repository = image_for(host).rsplit(":", 1)[0]
        tags = run_tool(
            node_docker(host, ["image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repository]),
            f"listing images on {host.name}",
            "check ssh to the node and its Docker engine",
        ).stdout.split()
        if not tags:
            continue
        out = run_tool(
            node_docker(host, ["image", "inspect", "--format", "{{.Id}} {{.Architecture}} {{.Created}}", *tags]),
            f"inspecting images on {host.name}",
        ).stdout.splitlines()
        for tag, line in zip(tags, out, strict=False):  # what the node's engine printed, no more
            image_id, arch, created = line.split(" ", 2)
            rows.append(NodeImage(host.name, tag, image_id, arch, created))
    return rows


def node_layers(host: Host) -> list[list[str]]:
    """The layers (diff IDs, base first) of every image the node holds."""
    ids = sorted(set(run_tool(node_docker(host, ["image", "ls", "-q", "--no-trunc"]), f"listing images on {host.name}",
                              "check ssh to the node and its Docker engine").stdout.split()))
    if not ids:
        return []
    out = run_tool(node_docker(host, ["image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids]), f"inspecting images on {host.name}").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
