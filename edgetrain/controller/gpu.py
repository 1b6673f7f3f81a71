"""GPU nodes: read ``nvidia-smi``, judge a driver against the CUDA of each of an image's stacks, check a node (a rank
pins its GPU with edgetrain.gpu).

Pure functions: the controller runs the node check over ssh (any ``run(argv) -> CompletedProcess``
callable, e.g. ``lambda argv: nodes.run(host, argv)``).

Driver rules (NVIDIA, CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver
Versions", Linux x86_64; and the CUDA Compatibility guide, "Minor Version Compatibility"):

- A driver runs every CUDA release up to the one it shipped with ("CUDA Version" in the
  ``nvidia-smi`` banner): binary backward compatibility. :data:`TOOLKIT_DRIVER` lists the driver
  each CUDA major.minor was released with (its GA).
- From CUDA 11 on, a newer minor release of the same major also runs on an older driver of that
  major family - *minor version compatibility* - with a limited feature set (no JIT of PTX newer
  than the driver; some newer APIs return ``cudaErrorCallRequiresNewerDriver``). The floors per
  major are in :data:`MINOR_COMPAT_DRIVER`: CUDA 11.x >= 450.80.02, CUDA 12.x >= 525.60.13,
  CUDA 13.x >= 580.65.06 (the 13.0 GA driver).
- Forward compatibility (the ``cuda-compat`` package on data-centre GPUs) is not considered here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edgetrain.controller.images.targets import image_for
from edgetrain.shared.errors import EdgetrainError

# The CUDA the CUDA image runs (TensorFlow 2.15.1's tensorflow[and-cuda] wheels: CUDA 12.2,
# cuDNN 8.9, NCCL 2.16), also written into the image's label CUDA_LABEL.
IMAGE_CUDA = "12.2"
CUDA_LABEL = "org.edgetrain.cuda.version"
# The CUDA of the image's torch, which brings CUDA libraries of its own (images.Target.torch_cuda).
TORCH_CUDA_LABEL = "org.edgetrain.torch.cuda"
# Compute capabilities the image has machine code for (TensorFlow's and Horovod's kernels).
MIN_COMPUTE_CAPABILITY = (7, 0)

# CUDA major.minor -> the Linux x86_64 driver its GA release requires (CUDA Toolkit Release
# Notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions").
TOOLKIT_DRIVER: dict[str, str] = {
    "11.0": "450.51.05",
    "11.1": "455.23",
    "11.2": "460.27.03",
    "11.3": "465.19.01",
    "11.4": "470.42.01",
    "11.5": "495.29.05",
    "11.6": "510.39.01",
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# CUDA major -> the lowest driver that runs any minor release of it (minor version compatibility;
# CUDA Compatibility guide and the release notes' Table 2).
MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# The fields edgetrain asks for; compute_cap is unknown to old drivers (they answer exit 2).
QUERY_FIELDS = ("index", "uuid", "name", "driver_version", "memory.total", "compute_cap")
NOT_FOUND = 127  # a shell's "command not found"
NO_DRIVER = 9  # nvidia-smi: "couldn't communicate with the NVIDIA driver"

Run = Callable[[list[str]], subprocess.CompletedProcess]


def version_tuple(version: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4); '12.2' -> (12, 2)."""
    try:
        return tuple(int(part) for part in version.strip().split("."))
    except ValueError:
        raise ValueError(f"not a version: {version!r}") from None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str | None = None
    memory_mib: int | None = None
    compute_cap: str | None = None  # "9.0"
    driver_version: str | None = None


@dataclass(frozen=True)
class SmiReport:
    """What ``nvidia-smi`` (the table) says: driver, the newest CUDA it supports, the GPUs."""

    driver_version: str
    cuda_version: str
    gpus: tuple[Gpu, ...] = ()


# --- parsing ------------------------------------------------------------------------------------

_BANNER = re.compile(r"Driver Version:\s*(?P<driver>[\d.]+)\s+CUDA Version:\s*(?P<cuda>[\d.]+|N/A)")
_TABLE_GPU = re.compile(r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s+\|\s+(?P<bus>[0-9A-Fa-f:.]+)\s")
_TABLE_MEMORY = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")
_LIST_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_BAD_FIELD = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')


def parse_smi(text: str) -> SmiReport:
    """The plain ``nvidia-smi`` table: driver and CUDA version from the banner, one Gpu per row."""
    banner = _BANNER.search(text)
    if banner is None:
        raise ValueError("no 'Driver Version: ... CUDA Version: ...' banner in the nvidia-smi output")
    gpus = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        row = _TABLE_GPU.match(line)
        if row is None:
            continue
        memory = _TABLE_MEMORY.search(lines[i + 1]) if i + 1 < len(lines) else None
        gpus.append(Gpu(
            index=int(row["index"]), name=row["name"].strip(),
            memory_mib=int(memory["total"]) if memory else None, driver_version=banner["driver"],
        ))
    return SmiReport(banner["driver"], banner["cuda"], tuple(gpus))


def parse_smi_list(text: str) -> list[Gpu]:
    """``nvidia-smi -L``: one Gpu per ``GPU N: NAME (UUID: ...)`` line (MIG lines are skipped)."""
    gpus = []
    for line in text.splitlines():
        m = _LIST_GPU.match(line)
        if m:
            gpus.append(Gpu(index=int(m["index"]), name=m["name"], uuid=m["uuid"]))
    return gpus


def unknown_query_field(text: str) -> str | None:
    """The field a ``--query-gpu`` named that this driver does not know (its exit 2), else None."""
    m = _BAD_FIELD.search(text)
    return m["field"] if m else None


def _field_name(header: str) -> str:
    return header.strip().split(" [", 1)[0]  # "memory.total [MiB]" -> "memory.total"


def parse_query(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str]]:
    """``--query-gpu=... --format=csv[,noheader]`` as one dict per GPU.

    Without ``fields`` the first line is the header (``--format=csv``); with them every line is
    data (``noheader``). Units stay in the values ("81559 MiB"); :func:`gpus_from_query` reads them.
    """
    bad = unknown_query_field(text)
    if bad:
        raise ValueError(f'nvidia-smi does not know the query field "{bad}"')
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            raise ValueError("empty nvidia-smi csv output (no header)")
        fields = [_field_name(h) for h in lines[0].split(",")]
        lines = lines[1:]
    rows = []
    for line in lines:
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi csv line has {len(values)} values for {len(fields)} fields: {line!r}")
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def _mib(value: str | None) -> int | None:
    if not value:
        return None
    m = re.match(r"(\d+)\s*MiB$", value.strip())
    return int(m.group(1)) if m else (int(value) if value.strip().isdigit() else None)


def gpus_from_query(rows: list[dict[str, str]]) -> list[Gpu]:
    def known(value: str | None) -> str | None:
        return None if value in (None, "", "[N/A]", "N/A", "[Not Supported]") else value

    return [
        Gpu(
            index=int(row["index"]), name=row.get("name", ""), uuid=known(row.get("uuid")),
            memory_mib=_mib(known(row.get("memory.total"))), compute_cap=known(row.get("compute_cap")),
            driver_version=known(row.get("driver_version")),
        )
        for row in rows
    ]


# --- the driver against the image's CUDA --------------------------------------------------------


@dataclass(frozen=True)
class DriverSupport:
    ok: bool
    mode: str  # "native" | "minor-version-compatibility" | "unsupported"
    driver_version: str
    image_cuda: str
    native_driver: str | None  # the driver the image's CUDA release requires in full
    minimum_driver: str | None  # the lowest driver that runs it at all
    note: str
    stack: str | None = None  # whose CUDA it is, where an image has more than one: "TensorFlow", "torch"

    def __str__(self) -> str:
        return self.note


def cuda_for_driver(driver_version: str) -> str | None:
    """The newest CUDA major.minor in TOOLKIT_DRIVER this driver was released for (or after)."""
    have = version_tuple(driver_version)
    fits = [cuda for cuda, need in TOOLKIT_DRIVER.items() if have >= version_tuple(need)]
    return max(fits, key=version_tuple) if fits else None


def check_driver(driver_version: str, image_cuda: str = IMAGE_CUDA, driver_cuda: str | None = None,
                 stack: str | None = None) -> DriverSupport:
    """Does an NVIDIA driver run an image built for CUDA ``image_cuda`` (major.minor)?

    ``driver_cuda`` is the "CUDA Version" of the driver's ``nvidia-smi`` banner, when known: a
    driver newer than this table says so itself. ``stack`` names whose CUDA it is in the note.
    """
    want = version_tuple(image_cuda)[:2]
    cuda = f"{want[0]}.{want[1]}"
    theirs = f"CUDA {cuda} of the image's {stack}" if stack else f"the image's CUDA {cuda}"
    have = version_tuple(driver_version)
    native = TOOLKIT_DRIVER.get(cuda)
    floor = MINOR_COMPAT_DRIVER.get(want[0])
    supported = driver_cuda if driver_cuda and driver_cuda != "N/A" else cuda_for_driver(driver_version)
    if (native and have >= version_tuple(native)) or (supported and version_tuple(supported)[:2] >= want):
        return DriverSupport(True, "native", driver_version, cuda, native, floor or native,
                             f"driver {driver_version} supports CUDA {supported or cuda} >= {theirs}", stack)
    if floor and have >= version_tuple(floor) and (supported is None or version_tuple(supported)[0] == want[0]):
        return DriverSupport(True, "minor-version-compatibility", driver_version, cuda, native, floor,
                             f"driver {driver_version} runs {theirs} through CUDA minor version "
                             f"compatibility (>= {floor}); CUDA {cuda} in full needs >= {native}", stack)
    need = floor or native
    return DriverSupport(False, "unsupported", driver_version, cuda, native, need,
                         f"driver {driver_version} is too old for {theirs} (needs >= {need}"
                         + (f"; >= {native} for all of CUDA {cuda}" if native and need != native else "") + ")", stack)


# --- a GPU node ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuNode:
    node: str
    driver_version: str
    cuda_version: str  # newest CUDA the driver supports
    gpus: tuple[Gpu, ...]
    container_gpus: tuple[Gpu, ...]
    drivers: tuple[DriverSupport, ...]  # the driver against each of the image's CUDA stacks
    warnings: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        names = ", ".join(sorted({g.name for g in self.gpus}))
        stacks = ", ".join(f"{d.stack}'s CUDA {d.image_cuda}" for d in self.drivers)
        return (f"{len(self.gpus)} x {names}; driver {self.driver_version} (CUDA {self.cuda_version}) for {stacks}; "
                f"{len(self.container_gpus)} visible in a container")


def _last_line(proc: subprocess.CompletedProcess) -> str:
    def text(value) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")

    for stream in (text(proc.stderr), text(proc.stdout)):
        lines = [line.strip() for line in stream.strip().splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return f"exit status {proc.returncode}"


def _out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode(errors="replace") if isinstance(proc.stdout, bytes) else (proc.stdout or "")


def _smi_failure(node: str, proc: subprocess.CompletedProcess) -> EdgetrainError:
    said = _last_line(proc)
    if proc.returncode == NOT_FOUND or "not found" in said:
        return EdgetrainError(f"{node}: nvidia-smi not found: no NVIDIA driver is installed",
                              "install the NVIDIA driver for its GPUs (the driver package brings nvidia-smi), or take the host out of the 'gpu' group")
    if proc.returncode == NO_DRIVER or "couldn't communicate with the NVIDIA driver" in said:
        return EdgetrainError(f"{node}: nvidia-smi cannot talk to the NVIDIA driver (exit {proc.returncode}): the kernel module is not loaded",
                              "load the driver (modprobe nvidia, or reboot after installing or upgrading it) and check `nvidia-smi` on the node")
    return EdgetrainError(f"{node}: nvidia-smi failed (exit {proc.returncode}): {said}", "run nvidia-smi on the node and fix what it reports")


def call(run: Run, argv: list[str]) -> subprocess.CompletedProcess:
    """``run(argv)``, with a missing program (a local host runs it without a shell) as exit 127."""
    try:
        return run(argv)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, NOT_FOUND, "", f"{argv[0]}: not found")


def query_gpus(run: Run, node: str) -> list[Gpu]:
    """The node's GPUs through ``--query-gpu``; without compute_cap on drivers that lack the field."""
    fields = list(QUERY_FIELDS)
    while True:
        proc = call(run, ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"])
        bad = unknown_query_field(_out(proc) + "\n" + (proc.stderr if isinstance(proc.stderr, str) else ""))
        if proc.returncode != 0 and bad in fields and bad != "index":
            fields.remove(bad)
            continue
        if proc.returncode != 0:
            raise _smi_failure(node, proc)
        return gpus_from_query(parse_query(_out(proc), fields))


def node_image_labels(run: Run, node: str, image: str) -> dict[str, str]:
    """The labels of the image on the node (CUDA_LABEL, TORCH_CUDA_LABEL among them); empty if it has none."""
    proc = call(run, ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image])
    if proc.returncode != 0:
        said = _last_line(proc)
        if "No such" in said:
            raise EdgetrainError(f"{node}: image {image} is not in its Docker engine", "edgetrain images distribute -i INVENTORY")
        raise EdgetrainError(f"{node}: docker image inspect {image} failed: {said}", "check the node's Docker engine (docker info)")
    try:
        return json.loads(_out(proc)) or {}
    except json.JSONDecodeError:
        raise EdgetrainError(f"{node}: docker image inspect {image} answered no labels: {_out(proc).strip()[:200]!r}",
                             "check the node's Docker engine (docker info)") from None


def container_gpus(run: Run, node: str, image: str) -> list[Gpu]:
    """The GPUs a container of ``image`` sees with ``--gpus all`` (the NVIDIA runtime injects nvidia-smi)."""
    argv = ["docker", "run", "--rm", "--gpus", "all", "--pull", "never", "--network", "none",
            "--entrypoint", "nvidia-smi", image, "-L"]
    proc = call(run, argv)
    if proc.returncode == 0:
        return parse_smi_list(_out(proc))
    said = _last_line(proc)
    if "executable file not found" in said:
        return _raise(f"{node}: the NVIDIA runtime gave the container no nvidia-smi ({said})",
                      "let the runtime mount the driver's utilities: NVIDIA_DRIVER_CAPABILITIES=compute,utility (the edgetrain CUDA image sets it)")
    if "could not select device driver" in said or "unknown or invalid runtime name: nvidia" in said:
        return _raise(f"{node}: Docker cannot give containers GPUs ({said})",
                      "install the NVIDIA container toolkit and its runtime entry in daemon.json: ansible-playbook playbooks/site.yml --tags docker --limit " + node)
    if "No such image" in said or "pull access denied" in said or ("not found" in said and "image" in said):
        return _raise(f"{node}: image {image} is not in its Docker engine", "edgetrain images distribute -i INVENTORY")
    if "nvidia-container-cli" in said:
        return _raise(f"{node}: the NVIDIA container runtime failed: {said}",
                      "check the driver and the toolkit on the node (nvidia-container-cli info)")
    return _raise(f"{node}: a GPU container failed ({shlex.join(argv)}): {said}", "run that command on the node and fix what it reports")


def _raise(problem: str, fix: str):
    raise EdgetrainError(problem, fix)


def check_node(run: Run, node: str, *, image: str, slots: int, image_cuda: str | None = None,
               torch_cuda: str | None = None, check_container: bool = True) -> GpuNode:
    """Everything a GPU node needs before ranks start on it; the first failure raises EdgetrainError.

    In order: ``nvidia-smi`` answers; the driver supports the CUDA of each of the image's stacks:
    TensorFlow's (``image_cuda``, else the image's CUDA_LABEL on the node, else IMAGE_CUDA) and
    torch's (``torch_cuda``, else the image's TORCH_CUDA_LABEL; an image without it, built before
    torch's CUDA was labelled or a site's own, is checked for TensorFlow's alone); every GPU is of a
    compute capability the image has code for; the GPUs cover the host's ``slots`` (one GPU per
    rank); a container of ``image`` started with ``--gpus all`` sees as many GPUs as the host.
    """
    banner = call(run, ["nvidia-smi"])
    if banner.returncode != 0:
        raise _smi_failure(node, banner)
    try:
        report = parse_smi(_out(banner))
    except ValueError as e:
        raise EdgetrainError(f"{node}: cannot read nvidia-smi's output: {e}", "run nvidia-smi on the node and check its driver") from None
    gpus = query_gpus(run, node)
    if not gpus:
        raise EdgetrainError(f"{node}: nvidia-smi lists no GPU (driver {report.driver_version})",
                             "check that the GPUs are seated and bound to the nvidia driver (lspci -k), or take the host out of the 'gpu' group")
    if check_container and (image_cuda is None or torch_cuda is None):
        labels = node_image_labels(run, node, image)
        image_cuda = image_cuda or labels.get(CUDA_LABEL)
        torch_cuda = torch_cuda or labels.get(TORCH_CUDA_LABEL)
    stacks = {"TensorFlow": image_cuda or IMAGE_CUDA, **({"torch": torch_cuda} if torch_cuda else {})}
    drivers = tuple(check_driver(report.driver_version, cuda, report.cuda_version, stack) for stack, cuda in stacks.items())
    refused = [d for d in drivers if not d.ok]
    if refused:
        # One upgrade for every stack: the driver the newest of their CUDA releases needs in full.
        full = max(drivers, key=lambda d: version_tuple(d.native_driver or d.minimum_driver or "0"))
        raise EdgetrainError(f"{node}: NVIDIA " + "; ".join(d.note for d in refused),
                             f"upgrade the node's NVIDIA driver to >= {full.native_driver or full.minimum_driver} (CUDA {full.image_cuda} in full)")
    warnings = [f"{node}: {d.note}" for d in drivers if d.mode != "native"]
    old = [g for g in gpus if g.compute_cap and version_tuple(g.compute_cap)[:2] < MIN_COMPUTE_CAPABILITY]
    if old:
        need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        raise EdgetrainError(
            f"{node}: GPU {old[0].index} ({old[0].name}) has compute capability {old[0].compute_cap}; the image has GPU code for >= {need}",
            f"use GPUs of compute capability {need} or newer (Volta and later), or take the host out of the 'gpu' group")
    if len(gpus) < slots:
        raise EdgetrainError(f"{node}: {slots} slots but {len(gpus)} GPU(s): every rank needs a GPU of its own",
                             f"set edgetrain_slots: {len(gpus)} for {node} in the inventory")
    seen: list[Gpu] = []
    if check_container:
        seen = container_gpus(run, node, image)
        if len(seen) < len(gpus):
            raise EdgetrainError(f"{node}: a container sees {len(seen)} of the host's {len(gpus)} GPUs",
                                 "check the NVIDIA container toolkit's configuration on the node (nvidia-ctk runtime configure --runtime=docker) and NVIDIA_VISIBLE_DEVICES")
    return GpuNode(node, report.driver_version, report.cuda_version, tuple(gpus), tuple(seen), drivers, tuple(warnings))


def check_host(nodes, host, image: str | None = None) -> GpuNode:
    """:func:`check_node` for an inventory host through an ``edgetrain.controller.remote.Nodes`` session
    (ssh exactly as Ansible reaches the node; a local host runs the commands directly), with the
    image the host runs and the host's slots."""
    if image is None:
        image = image_for(host)
    return check_node(lambda argv: nodes.run(host, argv), host.name, image=image, slots=host.slots)
