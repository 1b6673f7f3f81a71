"""The cluster as the Ansible inventory describes it.

The inventory is read through ``ansible-inventory --list`` so that INI, YAML and inventory plugins
all work, and so that provisioning and the CLI can never disagree about a host.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.shared.errors import EdgetrainError

# A host's variables as both this module and the preflight play check them (roles/preflight).
SCHEMA = json.loads(Path(__file__).with_name("inventory.schema.json").read_text())
PROPERTIES = SCHEMA["properties"]
ARCHES = tuple(PROPERTIES["edgetrain_arch"]["enum"])
RUNTIMES = tuple(PROPERTIES["edgetrain_runtime"]["enum"])
# Where a node keeps its runs (relative: under the ssh user's home) and finds its datasets
# (the datasets role's default, roles/datasets/defaults/main.yml).
DEFAULT_RUNS_DIR = PROPERTIES["edgetrain_runs_dir"]["default"]
DEFAULT_DATASETS_DIR = PROPERTIES["datasets_dir"]["default"]
DEVICE_GROUPS = ("rpi", "gpu")


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_inventory() -> Path:
    return project_root() / "inventories" / "local"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    arch: str
    slots: int
    runtime: str
    connection: str = "ssh"
    user: str | None = None
    port: int = 22
    iface: str | None = None
    image: str | None = None
    runs_dir: str = DEFAULT_RUNS_DIR
    datasets_dir: str = DEFAULT_DATASETS_DIR
    mpi_env: dict = field(default_factory=dict, compare=False, hash=False)  # extra environment for every rank
    lease_seconds: int = 90  # a container outlives its controller's last sign of life by this much
    groups: frozenset[str] = field(default_factory=frozenset)
    vars: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def is_gpu(self) -> bool:
        return "gpu" in self.groups

    @property
    def device(self) -> str:
        return "gpu" if self.is_gpu else "cpu"

    @property
    def ssh_target(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address


@dataclass(frozen=True)
class Inventory:
    source: Path
    hosts: tuple[Host, ...]

    @property
    def head(self) -> Host:
        heads = [h for h in self.hosts if "head" in h.groups]
        if len(heads) != 1:
            raise EdgetrainError(
                f"inventory {self.source} has {len(heads)} hosts in group 'head'",
                "put exactly one host in 'head' (it runs mpirun and holds rank 0)",
            )
        return heads[0]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise EdgetrainError(f"no host {name!r} in inventory {self.source}")


def _ansible_inventory_json(path: Path) -> dict:
    # Installed beside this Python (a venv need not be activated), else from PATH.
    beside = Path(sys.executable).parent / "ansible-inventory"
    exe = str(beside) if beside.exists() else shutil.which("ansible-inventory")
    if exe is None:
        raise EdgetrainError("ansible-inventory is not on PATH", "install edgetrain with its dependencies (make setup)")
    proc = subprocess.run(
        [exe, "-i", str(path), "--list"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true", "ANSIBLE_NOCOLOR": "1"}, check=False
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EdgetrainError(f"cannot read inventory {path}: {last}", "check the file with: ansible-inventory -i PATH --list")
    return json.loads(proc.stdout)


def _group_hosts(data: dict, group: str, seen: set[str]) -> list[str]:
    """Hosts of a group and its children, depth first, in the order the inventory lists them."""
    entry = data.get(group, {})
    names = [h for h in entry.get("hosts", []) if h not in seen]
    seen.update(names)
    for child in entry.get("children", []):
        names += _group_hosts(data, child, seen)
    return names


def _memberships(data: dict) -> dict[str, set[str]]:
    member: dict[str, set[str]] = {}

    def walk(group: str, parents: tuple[str, ...]) -> None:
        entry = data.get(group, {})
        for h in entry.get("hosts", []):
            member.setdefault(h, set()).update((*parents, group))
        for child in entry.get("children", []):
            walk(child, (*parents, group))

    walk("all", ())
    return member


class Invalid(ValueError):
    """A value the schema refuses; the message is the one line that says why."""


# The JSON types a rule names, exactly: true is no number (Python's bool is an int), 22.9 no integer.
JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "object": (dict,)}


def _typed(value, types: str | list[str]) -> bool:
    wanted = tuple(t for name in ([types] if isinstance(types, str) else types) for t in JSON_TYPES[name])
    return isinstance(value, wanted) and not isinstance(value, bool)


def conform(key: str, value):
    """``value`` as the schema's rule for ``key`` takes it (an integer from its digits), or Invalid."""
    return _conform(PROPERTIES[key], key, value)


def _conform(rule: dict, key: str, value):
    meaning, problem = rule.get("x-meaning", ""), rule.get("x-problem", "")
    if "enum" in rule:
        if value not in rule["enum"]:
            raise Invalid(f"{key} is {value or 'missing'}; set it to one of {', '.join(rule['enum'])}")
        return value
    if rule["type"] == "integer":
        # Digits as text, as an INI inventory may give them, are the number they spell (the play does the same);
        # a few: Python refuses to read thousands.
        number = int(value) if isinstance(value, str) and re.fullmatch("[0-9]{1,20}", value) else value
        if not _typed(number, "integer"):
            raise Invalid(f"{key} is {value!r}, not {meaning}")
        if not rule["minimum"] <= number <= rule["maximum"]:
            raise Invalid(f"{key} is {number}; it must be {meaning} from {rule['minimum']} to {rule['maximum']}")
        return number
    if rule["type"] == "object":
        if not _typed(value, "object"):
            raise Invalid(f"{key} {problem}")
        for name, item in value.items():
            _conform(rule["propertyNames"], f"{key} name", name)
            _conform(rule["additionalProperties"], f"{key} {name}", item)
        return value
    # Whole-string, as JSON Schema means it: re.match's "$" would let a trailing line break through.
    if not (_typed(value, rule["type"]) and (not isinstance(value, str) or re.fullmatch(rule["pattern"], value, re.S))):
        raise Invalid(f"{key} {value!r} {problem}")
    return value


def _host(name: str, hv: dict, groups: set[str], source: Path) -> Host:
    def checked(key: str, default=None):
        """The host's value for ``key`` - else ``default``, else the schema's - as the schema takes it."""
        raw = hv.get(key)
        if raw is None or raw == "":
            raw = default if default is not None else PROPERTIES[key].get("default")
        try:
            return conform(key, raw)
        except Invalid as exc:
            raise EdgetrainError(f"host {name} in {source}: {exc}") from None

    def given(key: str):
        """The host's value for an optional ``key`` as the schema takes it; None when unset."""
        return None if hv.get(key) in (None, "") else checked(key)

    connection = str(hv.get("ansible_connection", "ssh"))
    local = connection == "local"
    arch = checked("edgetrain_arch", platform.machine() if local else "")
    slots = checked("edgetrain_slots", (os.cpu_count() or 1) if local else 1)
    runtime = checked("edgetrain_runtime")
    port = checked("ansible_port")
    datasets_dir = checked("datasets_dir")
    # The controller renews every 10 s: a shorter lease would end healthy containers.
    lease = checked("edgetrain_lease_seconds")
    env = checked("edgetrain_mpi_env", {})
    given("edgetrain_mpi_user")  # provisioning needs it (preflight); the CLI checks it when given
    given("edgetrain_model")  # informational (the board), checked as the play checks it
    # The address, user, image and directories reach command lines (ssh, docker's volumes, the
    # machinefile): the schema refuses a value that would read as an option or split a field there.
    return Host(
        name=name,
        address=checked("ansible_host", name),
        arch=arch,
        slots=slots,
        runtime=runtime,
        connection=connection,
        user=given("ansible_user"),
        port=port,
        iface=given("edgetrain_iface"),
        image=given("edgetrain_image"),
        runs_dir=checked("edgetrain_runs_dir"),
        datasets_dir=datasets_dir,
        mpi_env={str(k): str(v) for k, v in env.items()},
        lease_seconds=lease,
        groups=frozenset(groups - {"all"}),
        vars=hv,
    )


def load(path: Path | None = None) -> Inventory:
    """Read an inventory (a file or a directory); ``None`` means the embedded local default."""
    source = Path(path) if path is not None else default_inventory()
    if not source.exists():
        raise EdgetrainError(f"inventory {source} does not exist", "pass -i inventories/<cluster> (copy inventories/example)")
    data = _ansible_inventory_json(source)
    top = "cluster" if "cluster" in data else "all"
    names = _group_hosts(data, top, set())
    if not names:
        raise EdgetrainError(f"inventory {source} has no hosts in group '{top}'")
    hostvars = data.get("_meta", {}).get("hostvars", {})
    member = _memberships(data)
    hosts = [_host(n, hostvars.get(n, {}), member.get(n, set()), source) for n in names]
    # Rank 0 lives on the head: it runs mpirun and writes the checkpoints.
    hosts.sort(key=lambda h: "head" not in h.groups)
    return Inventory(source=source, hosts=tuple(hosts))
