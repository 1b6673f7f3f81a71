"""This machine's Docker engine (``DOCKER_HOST`` or the default socket), driven through the Docker
SDK for Python: the client, inspection and labels, and builds with their log streamed and each step
reported as progress."""

from __future__ import annotations

import os
import sys
import tarfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import docker
import docker.errors

from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.images.tools import Log

_ENGINES: dict[tuple[str | None, ...], docker.DockerClient] = {}
ENGINE_FIX = "start the Docker engine (systemctl start docker) or point DOCKER_HOST at one"


def engine() -> docker.DockerClient:
    """A client of this machine's engine, as the docker CLI would pick it (DOCKER_HOST, TLS vars)."""
    key = tuple(os.environ.get(name) for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"))
    client = _ENGINES.get(key)
    if client is None:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            client = docker.from_env(timeout=600)
        except docker.errors.DockerException as e:
            raise EdgetrainError(f"cannot reach this machine's Docker engine ({where}): {e}", ENGINE_FIX) from None
        _ENGINES[key] = client
    return client


def inspect_image(ref: str) -> dict | None:
    """``docker image inspect`` of this machine's engine; None when it has no such image."""
    try:
        return engine().api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as e:
        raise EdgetrainError(f"inspecting {ref} in this machine's Docker engine failed: {e.explanation or e}", ENGINE_FIX) from None
    except docker.errors.DockerException as e:  # engine gone, socket refused
        raise EdgetrainError(f"cannot reach this machine's Docker engine: {e}", ENGINE_FIX) from None


def image_labels(ref: str) -> dict[str, str] | None:
    """The labels of an image in this machine's engine (empty when it has none); None without it."""
    found = inspect_image(ref)
    return None if found is None else dict((found.get("Config") or {}).get("Labels") or {})


def local_image_id(ref: str) -> str | None:
    """The image ID this machine's engine holds for ``ref``; None without the image or the engine."""
    try:
        found = inspect_image(ref)
    except EdgetrainError:
        return None
    return found["Id"] if found else None


def _tar_stream(context: Path) -> Iterator[bytes]:
    """The build context as a tar stream, written by a thread as the engine reads it (the wheelhouse
    is gigabytes: no temporary archive)."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(context.rglob("*")):
                    tar.add(path, arcname=path.relative_to(context).as_posix(), recursive=False)
        except BaseException as e:  # noqa: BLE001 - handed to the reading side
            failed.append(e)

    writer = threading.Thread(target=write, name="build-context", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            yield chunk
    writer.join()
    if failed and not isinstance(failed[0], BrokenPipeError):
        raise EdgetrainError(f"packing the build context {context} failed: {failed[0]}")


def _elapsed(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _verbatim(log: Log | None) -> Log | None:
    """``log`` for text that is not markup: a Dockerfile line like ``CMD [/bin/sh]`` must print as
    written through a rich console (the CLI's), and not wrap mid-line."""
    console = getattr(log, "__self__", None)
    if log is not None and console is not None and type(console).__module__.split(".")[0] == "rich":
        return lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)
    return log


def engine_build(
    context: Path,
    *,
    tag: str,
    platform: str,
    dockerfile: str = "Dockerfile",
    buildargs: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    network_mode: str | None = None,
    log: Log | None = print,
    output: IO[str] | None = None,
) -> str:
    """Build ``context`` in this machine's engine; the image ID.

    The engine's log goes to ``output`` (default: standard output) as it comes, line by line, and
    every ``Step N/M`` is also reported through ``log`` with the time so far: the progress of a
    build that runs for many minutes. A failed step raises EdgetrainError with the engine's message.
    """
    start = time.monotonic()
    log = _verbatim(log)
    sink = output if output is not None else sys.stdout
    tail: deque[str] = deque(maxlen=5)
    image_id = None
    pending = ""

    def line_out(line: str) -> None:
        if line.startswith("Step ") and log is not None:
            log(f"{tag} {_elapsed(time.monotonic() - start)} {line}")
            if output is None:
                return
        sink.write(line + "\n")
        sink.flush()
        if line.strip():
            tail.append(line.strip())

    try:
        stream = engine().api.build(
            fileobj=_tar_stream(context), custom_context=True, dockerfile=dockerfile, tag=tag, platform=platform,
            buildargs=buildargs or {}, labels=labels, network_mode=network_mode, rm=True, forcerm=True,
            decode=True, timeout=None,
        )
        for chunk in stream:
            if "error" in chunk:
                if pending:
                    line_out(pending)
                error = (chunk.get("errorDetail") or {}).get("message") or chunk["error"]
                raise EdgetrainError(f"docker build of {tag} failed: {error.strip()}", "see the build log above")
            if "stream" in chunk:
                pending += chunk["stream"]
                *lines, pending = pending.split("\n")
                for line in lines:
                    line_out(line)
            elif "status" in chunk:  # pulls: "id: status progress"
                line_out(" ".join(str(chunk[k]) for k in ("id", "status", "progress") if chunk.get(k)))
            elif "ID" in (chunk.get("aux") or {}):
                image_id = chunk["aux"]["ID"]
        if pending:
            line_out(pending)
    except docker.errors.APIError as e:
        raise EdgetrainError(f"docker build of {tag} failed: {e.explanation or e}", ENGINE_FIX) from None
    except docker.errors.DockerException as e:
        raise EdgetrainError(f"cannot reach this machine's Docker engine: {e}", ENGINE_FIX) from None
    found = inspect_image(tag)
    if found is None or (image_id and found["Id"] != image_id):
        raise EdgetrainError(f"docker build of {tag} ended without the image ({' | '.join(tail) or 'no output'})", "see the build log above")
    return found["Id"]
