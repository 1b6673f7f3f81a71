"""Sending each node the image of its flavour over ssh (``docker save | ssh node docker load``, no
registry anywhere): skipped where the node holds the image ID already, and without the layers it
holds."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

import docker.errors

from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.controller.images.catalog import docker_hosts, node_docker, node_image_id, node_layers
from edgetrain.controller.images.local_engine import engine, inspect_image
from edgetrain.controller.images.targets import TARGETS, image_for, target_for
from edgetrain.controller.images.tools import Log


@dataclass(frozen=True)
class Shipment:
    host: str
    tag: str
    image_id: str
    loaded: bool  # False: the node already had this image ID


def _local_image(tag: str, for_hosts: Iterable[Host]) -> dict[str, Any]:
    """``docker image inspect`` of ``tag`` on this machine, which must hold it."""
    found = inspect_image(tag)
    if found is None:
        names = ", ".join(h.name for h in for_hosts)
        arch = tag.rsplit("-", 1)[-1]
        fix = f"edgetrain images build --arch {arch}" if arch in TARGETS else f"build or pull {tag} on this machine"
        raise EdgetrainError(f"image {tag} (for {names}) is not in this machine's Docker engine", fix)
    return found


def layers_held(layers: list[str], on_node: list[list[str]]) -> int:
    """How many of an image's layers (base first) a node holds: the longest prefix it shares with an
    image there. A layer is the whole chain below it, so a diff ID found elsewhere is not the same layer."""
    return max((len(os.path.commonprefix([layers, other])) for other in on_node), default=0)  # noqa: RUF071 - of lists, item by item


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks read as a file (``docker save``'s stream, for tarfile)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = chunk
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def copy_without(saved: IO[bytes], out: IO[bytes], held: set[str]) -> int:
    """Copy a ``docker save`` archive to ``out`` without the files whose content is a layer in ``held``
    (by diff ID: the sha256 of the uncompressed layer); the bytes of file content written. ``docker
    load`` opens a layer's file only when its engine lacks that layer, so the node still gets the
    whole image. Each file is hashed before it is written, so it is spooled first (in memory while small)."""
    written = 0
    with tarfile.open(fileobj=saved, mode="r|") as src, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            data = src.extractfile(member) if member.isfile() else None
            if data is None:
                dst.addfile(member)
                continue
            with tempfile.SpooledTemporaryFile(max_size=1 << 20) as spool:
                digest = hashlib.sha256()
                for block in iter(functools.partial(data.read, 1 << 20), b""):
                    digest.update(block)
                    spool.write(block)
                if f"sha256:{digest.hexdigest()}" in held:
                    continue
                spool.seek(0)
                dst.addfile(member, spool)
                written += member.size
    return written


def _send(tag: str, host: Host, held: set[str]) -> int:
    """``docker save TAG`` from this machine's engine (SDK) into ``docker load`` on the node (ssh + CLI),
    without the layers in ``held``; the bytes sent."""
    with tempfile.TemporaryFile() as said:
        load = subprocess.Popen(node_docker(host, ["load"]), stdin=subprocess.PIPE, stdout=said, stderr=said)
        assert load.stdin is not None
        problem, sent = None, None
        try:
            saved = engine().api.get_image(tag)
            if held:
                sent = copy_without(io.BufferedReader(_Chunks(saved), 1 << 20), load.stdin, held)
            else:  # nothing to leave out: the archive as it comes, with no file spooled
                sent = 0
                for chunk in saved:
                    load.stdin.write(chunk)
                    sent += len(chunk)
        except BrokenPipeError:
            problem = "the node's docker load ended early"
        except docker.errors.DockerException as e:
            problem = f"docker save failed: {e}"
        except tarfile.TarError as e:
            problem = f"docker save's archive could not be read: {e}"
        finally:
            try:
                load.stdin.close()
            except BrokenPipeError:
                pass
            code = load.wait()
        said.seek(0)
        output = said.read().decode(errors="replace").strip()
    if problem or code != 0 or sent is None:
        raise EdgetrainError(f"sending {tag} to {host.name} failed: {output or problem}", "check disk space and the Docker engine on the node")
    return sent


def distribute(inventory: Inventory, log: Log = print) -> list[Shipment]:
    """Ship each docker-runtime node the image of its arch, skipping nodes that already hold it.

    Every node is checked before anything is sent, then all are sent to at once: a Pi's ``docker
    load`` is bound by its SD card more than by the controller's link, so the nodes' loads overlap
    rather than queue. One node's failure leaves the others' sends to finish."""
    hosts = docker_hosts(inventory)
    if not hosts:
        raise EdgetrainError(f"no host in {inventory.source} uses the docker runtime", "set edgetrain_runtime: docker on the nodes that run containers")
    for host in hosts:
        arch = _local_image(image_for(host), [host])["Architecture"]
        if arch != target_for(host).docker_arch:
            raise EdgetrainError(f"image {image_for(host)} is {arch} but {host.name} is {host.arch}", "set edgetrain_image for the node to an image of its arch")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        sending = [pool.submit(_ship, host, log) for host in hosts]
    # The first node's failure, in inventory order, once every node's send has ended.
    return [future.result() for future in sending]


def _ship(host: Host, log: Log) -> Shipment:
    tag = image_for(host)
    local = _local_image(tag, [host])
    image_id = local["Id"]
    if node_image_id(host, tag) == image_id:
        log(f"{host.name}: {tag} {image_id[7:19]} already present")
        return Shipment(host.name, tag, image_id, loaded=False)
    layers = local["RootFS"]["Layers"]
    held = layers_held(layers, node_layers(host))
    log(f"{host.name}: sending {tag} {image_id[7:19]}" + (f" ({held} of its {len(layers)} layers already there)" if held else ""))
    # A layer's content can recur above the shared prefix (an empty one, say): that one is sent.
    sent = _send(tag, host, set(layers[:held]) - set(layers[held:]))
    have = node_image_id(host, tag)
    if have != image_id:
        raise EdgetrainError(f"{host.name} holds {tag} as {have}, expected {image_id}", "re-run edgetrain images distribute")
    log(f"{host.name}: {tag} loaded ({sent / 1e6:,.0f} MB sent), image ID verified")
    return Shipment(host.name, tag, image_id, loaded=True)
