"""A script's extra Python packages (``requirements.txt`` beside it, or ``--requirements FILE``).

The host runtime installs what is missing into its own environment, pinned by constraints.txt so
that TensorFlow and Horovod stay as built. Containers cannot install at run time (a node has no
package index), so ``edgetrain images build --requirements FILE`` bakes the packages into the
node image from wheels downloaded here, and preflight checks inside each node's image.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from edgetrain.controller import images
from edgetrain.shared.errors import EdgetrainError, UsageError
from edgetrain.controller.inventory import Host, project_root
from edgetrain.controller.remote import Nodes

LABEL = "org.edgetrain.requirements.sha256"
# Run with the image's Python: prints each requirement the environment does not satisfy.
CHECK = (
    "import sys\n"
    "from importlib import metadata\n"
    "from packaging.requirements import Requirement\n"
    "for line in sys.argv[1:]:\n"
    "    r = Requirement(line)\n"
    "    try:\n"
    "        ok = r.specifier.contains(metadata.version(r.name), prereleases=True)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        ok = False\n"
    "    if not ok:\n"
    "        print(line)\n"
)
ONE_PER_LINE = "list one package per line (name and version)"
NOT_FOUND = re.compile(r"No matching distribution found for (\S+)|Could not find a version that satisfies the requirement (\S+)")


def read(path: Path) -> list[str]:
    """The requirement lines of a file; pip options, includes and direct references (``pkg @ URL``)
    are refused, not ignored: what is installed comes from the package index (or wheelhouse) by
    name and version, pinned by constraints.txt, never from wherever a line points."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read requirements {path}: {exc.strerror or exc}") from None
    found = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise UsageError(f"{path} line {n}: {line.split()[0]} is not supported", ONE_PER_LINE)
        try:
            r = Requirement(line)
        except InvalidRequirement as exc:
            raise UsageError(f"{path} line {n}: {exc}") from None
        if r.url:  # not echoed: a URL may carry a token
            raise UsageError(f"{path} line {n}: {r.name} @ URL (a direct reference) is not supported", ONE_PER_LINE)
        found.append(line)
    return found


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def missing_here(lines: list[str]) -> list[str]:
    missing = []
    for line in lines:
        r = Requirement(line)
        try:
            ok = r.specifier.contains(metadata.version(r.name), prereleases=True)
        except metadata.PackageNotFoundError:
            ok = False
        if not ok:
            missing.append(line)
    return missing


def _not_found(pip_output: str, source: Path) -> EdgetrainError:
    m = NOT_FOUND.search(pip_output)
    name = (m.group(1) or m.group(2)) if m else None
    last = (pip_output.strip().splitlines() or ["no output"])[-1]
    what = f"package {name} from {source} cannot be installed" if name else f"the packages of {source} cannot be installed: {last}"
    return EdgetrainError(what, "check its name and version, and that the package index (or --find-links wheelhouse) has it")


def install_here(path: Path, lines: list[str], log: Callable[[str], None]) -> list[str]:
    """Install into this Python environment what it lacks; returns what was missing."""
    missing = missing_here(lines)
    if not missing:
        return []
    log(f"installing {len(missing)} requirement(s) from {path}: {', '.join(missing)}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           "-c", str(images.constraints_file()), *missing], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise _not_found(proc.stdout + proc.stderr, path)
    return missing


def missing_in_image(nodes: Nodes, host: Host, image: str, lines: list[str]) -> list[str]:
    """What the node's image lacks, checked with the image's own Python (no network, nothing pulled)."""
    out = nodes.check(host, ["docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint",
                             "/opt/edgetrain/bin/python", image, "-c", CHECK, *lines], "checking the image's Python packages")
    return out.split("\n") if out.strip() else []


def fix_command(arch: str, path: Path | str) -> str:
    return f"edgetrain images build --arch {arch} --requirements {shlex.quote(str(path))} && edgetrain images distribute -i INVENTORY"


def build_image(arch: str, base_tag: str, path: Path, log: Callable[[str], None], tag: str | None = None) -> str:
    """Layer the requirements onto ``base_tag``: wheels downloaded here for the image's platform,
    installed in the image with no index, built in this machine's engine. Tagged ``tag`` (default:
    the base's own tag)."""
    lines = read(path)
    tgt = images.target(arch)
    with tempfile.TemporaryDirectory(prefix="edgetrain-requirements-") as tmp:
        context = Path(tmp)
        (context / "requirements.txt").write_text("\n".join(lines) + "\n")
        shutil.copy(project_root() / "images" / "Dockerfile.requirements", context / "Dockerfile")
        platform = [arg for t in tgt.platform_tags() for arg in ("--platform", t)]
        log(f"downloading wheels for {len(lines)} requirement(s) ({tgt.platform}, python {tgt.python})")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
                               *platform, "--python-version", tgt.python, "--implementation", "cp",
                               "-c", str(images.constraints_file()), "-d", str(context / "wheels"), *lines],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise _not_found(proc.stdout + proc.stderr, path)
        tag = tag or base_tag
        log(f"building {tag} from {base_tag} with {', '.join(lines)}")
        with open(os.devnull, "w") as quiet:  # the steps are reported through log
            images.engine_build(context, tag=tag, platform=tgt.platform, buildargs={"BASE_IMAGE": base_tag},
                                labels={LABEL: digest(lines)}, log=log, output=quiet)
    return tag

