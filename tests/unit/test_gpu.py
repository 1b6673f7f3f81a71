"""edgetrain.controller.gpu against real nvidia-smi output (one H100, driver 580.159.04, CUDA 13.0), a scripted
node and a faked tf.config: no GPU on the machines that run these tests.

The captured answers are copied verbatim from the fixtures in the shared fixture directory
(captured on a GPU server, see its README); the multi-GPU and failure answers are built from them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.controller import gpu
from edgetrain import gpu as pin
from edgetrain.shared.errors import EdgetrainError

# --- real nvidia-smi answers (exit 0 except the bad field: exit 2) ---------------------------------
SMI = (
    'Mon Nov 23 00:08:58 2026       \n'
    '+-----------------------------------------------------------------------------------------+\n'
    '| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n'
    '+-----------------------------------------+------------------------+----------------------+\n'
    '| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n'
    '| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n'
    '|                                         |                        |               MIG M. |\n'
    '|=========================================+========================+======================|\n'
    '|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:06.0 Off |                    0 |\n'
    '| N/A   38C    P0             82W /  700W |       0MiB /  81559MiB |      0%      Default |\n'
    '|                                         |                        |             Disabled |\n'
    '+-----------------------------------------+------------------------+----------------------+\n'
    '\n'
    '+-----------------------------------------------------------------------------------------+\n'
    '| Processes:                                                                              |\n'
    '|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n'
    '|        ID   ID                                                               Usage      |\n'
    '|=========================================================================================|\n'
    '|  No running processes found                                                             |\n'
    '+-----------------------------------------------------------------------------------------+\n'
)
SMI_L = 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)\n'
QUERY_NOHEADER = '0, GPU-00000000-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 9.0\n'
QUERY_HEADER = (
    'index, name, driver_version, memory.total [MiB], memory.used [MiB], utilization.gpu [%], temperature.gpu, power.draw [W]\n'
    '0, NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 0 MiB, 0 %, 38, 73.71 W\n'
)
QUERY_BAD_FIELD = (
    'Field "bogus" is not a valid field to query.\n'
    '\n'
)
# Documented by NVIDIA's tools (not captured): no kernel module loaded.
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")

FIXTURES = Path(os.environ.get("EDGETRAIN_GPU_FIXTURES", "/work/shared/fixtures/gpu"))
UUID = "GPU-00000000-1111-2222-3333-444444444444"
IMAGE = "edgetrain:0.1.0-cuda"


def test_embedded_answers_are_the_captured_ones():
    if not FIXTURES.is_dir():
        pytest.skip(f"{FIXTURES} not on this machine (set EDGETRAIN_GPU_FIXTURES)")
    for name, text in [("nvidia-smi.txt", SMI), ("nvidia-smi-L.txt", SMI_L), ("query-gpu-noheader.csv", QUERY_NOHEADER),
                       ("query-gpu-header.csv", QUERY_HEADER), ("query-bad-field.txt", QUERY_BAD_FIELD)]:
        assert (FIXTURES / name).read_text() == text, name


def two_gpu(text: str) -> str:
    """A second H100 in the captured format: GPU index 0 -> 1, UUID ...444 -> ...555."""
    lines = text.splitlines(keepends=True)
    gpu_lines = [line for line in lines if UUID in line or line.startswith("0, ")]
    extra = [line.replace(UUID, UUID[:-3] + "555").replace("GPU 0:", "GPU 1:").replace("0, ", "1, ", 1) for line in gpu_lines]
    return "".join(lines + extra)


def smi_table(driver: str, cuda: str, ngpus: int = 1) -> str:
    """The captured table with another driver/CUDA in its banner and ``ngpus`` GPU rows."""
    lines = SMI.splitlines(keepends=True)
    banner = lines[2].replace("580.159.04", driver).replace("CUDA Version: 13.0", f"CUDA Version: {cuda}")
    row = lines[8:11]
    rows = [r.replace("|   0  ", f"|   {i}  ", 1) if j == 0 else r for i in range(ngpus) for j, r in enumerate(row)]
    return "".join(lines[:2] + [banner] + lines[3:8] + rows + lines[11:])


# --- parsing ------------------------------------------------------------------------------------


def test_parse_smi_table():
    report = gpu.parse_smi(SMI)
    assert report.driver_version == "580.159.04"
    assert report.cuda_version == "13.0"
    assert report.gpus == (gpu.Gpu(index=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559, driver_version="580.159.04"),)


def test_parse_smi_table_with_two_gpus_and_another_driver():
    report = gpu.parse_smi(smi_table("535.104.05", "12.2", ngpus=2))
    assert (report.driver_version, report.cuda_version) == ("535.104.05", "12.2")
    assert [g.index for g in report.gpus] == [0, 1]


def test_parse_smi_without_banner_is_an_error():
    with pytest.raises(ValueError, match="banner"):
        gpu.parse_smi(SMI_L)


def test_parse_smi_list():
    assert gpu.parse_smi_list(SMI_L) == [gpu.Gpu(index=0, name="NVIDIA H100 80GB HBM3", uuid=UUID)]
    two = gpu.parse_smi_list(two_gpu(SMI_L))
    assert [(g.index, g.uuid[-3:]) for g in two] == [(0, "444"), (1, "555")]
    # MIG instances are listed indented under their GPU; they are not GPUs of their own.
    mig = SMI_L + "  MIG 1g.10gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
    assert len(gpu.parse_smi_list(mig)) == 1


def test_parse_query_noheader():
    rows = gpu.parse_query(QUERY_NOHEADER, gpu.QUERY_FIELDS)
    assert rows == [{"index": "0", "uuid": UUID, "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04",
                     "memory.total": "81559 MiB", "compute_cap": "9.0"}]
    assert gpu.gpus_from_query(rows) == [gpu.Gpu(0, "NVIDIA H100 80GB HBM3", UUID, 81559, "9.0", "580.159.04")]


def test_parse_query_with_header_reads_field_names_without_units():
    rows = gpu.parse_query(QUERY_HEADER)
    assert list(rows[0]) == ["index", "name", "driver_version", "memory.total", "memory.used", "utilization.gpu",
                             "temperature.gpu", "power.draw"]
    assert rows[0]["power.draw"] == "73.71 W"
    (g,) = gpu.gpus_from_query(rows)
    assert (g.index, g.memory_mib, g.driver_version, g.uuid, g.compute_cap) == (0, 81559, "580.159.04", None, None)


def test_parse_query_bad_field():
    assert gpu.unknown_query_field(QUERY_BAD_FIELD) == "bogus"
    assert gpu.unknown_query_field(QUERY_NOHEADER) is None
    with pytest.raises(ValueError, match='"bogus"'):
        gpu.parse_query(QUERY_BAD_FIELD)


def test_parse_query_wrong_field_count_is_an_error():
    with pytest.raises(ValueError, match="6 values for 5 fields"):
        gpu.parse_query(QUERY_NOHEADER, gpu.QUERY_FIELDS[:5])


# --- driver against the image's CUDA ------------------------------------------------------------


def test_version_tuple():
    assert gpu.version_tuple("580.159.04") == (580, 159, 4)
    assert gpu.version_tuple("455.23") == (455, 23)
    with pytest.raises(ValueError):
        gpu.version_tuple("five")


@pytest.mark.parametrize(
    ("driver", "cuda", "ok", "mode"),
    [
        ("580.159.04", "12.2", True, "native"),  # the captured H100 server
        ("535.54.03", "12.2", True, "native"),  # CUDA 12.2 GA's own driver
        ("535.54.02", "12.2", True, "minor-version-compatibility"),
        ("525.60.13", "12.2", True, "minor-version-compatibility"),  # the CUDA 12.x floor
        ("525.60.12", "12.2", False, "unsupported"),
        ("520.61.05", "12.2", False, "unsupported"),  # CUDA 11.8's driver: another major
        ("470.42.01", "11.8", True, "minor-version-compatibility"),
        ("450.80.02", "11.8", True, "minor-version-compatibility"),  # the CUDA 11.x floor
        ("450.51.06", "11.8", False, "unsupported"),
        ("570.26", "12.8", True, "native"),  # the CUDA image's torch (PyPI's 2.9.1, CUDA 12.8)
        ("550.54.14", "12.8", True, "minor-version-compatibility"),
        ("575.51.03", "13.0", False, "unsupported"),  # a 12.x driver cannot run CUDA 13
        ("580.65.06", "13.0", True, "native"),
    ],
)
def test_check_driver_follows_nvidias_table(driver, cuda, ok, mode):
    support = gpu.check_driver(driver, cuda)
    assert (support.ok, support.mode) == (ok, mode), support.note


def test_check_driver_messages_name_the_versions():
    too_old = gpu.check_driver("520.61.05", "12.2")
    assert too_old.minimum_driver == "525.60.13" and too_old.native_driver == "535.54.03"
    assert str(too_old) == "driver 520.61.05 is too old for the image's CUDA 12.2 (needs >= 525.60.13; >= 535.54.03 for all of CUDA 12.2)"
    compat = gpu.check_driver("530.30.02", "12.2")
    assert "minor version compatibility (>= 525.60.13)" in compat.note and "needs >= 535.54.03" in compat.note


def test_check_driver_trusts_the_banner_for_drivers_newer_than_the_table():
    # A driver whose banner says CUDA 12.2 runs CUDA 12.2 natively, whatever its number.
    assert gpu.check_driver("999.1", "12.2", driver_cuda="12.2").mode == "native"
    # The captured server: CUDA 13.0 >= 12.2.
    report = gpu.parse_smi(SMI)
    assert gpu.check_driver(report.driver_version, gpu.IMAGE_CUDA, report.cuda_version).mode == "native"


def test_cuda_for_driver():
    assert gpu.cuda_for_driver("580.159.04") == "13.0"
    assert gpu.cuda_for_driver("535.104.05") == "12.2"
    assert gpu.cuda_for_driver("525.60.13") == "12.0"
    assert gpu.cuda_for_driver("418.39") is None


def test_tables_are_ordered():
    # Each CUDA release needs at least the driver of the release before it.
    drivers = [gpu.version_tuple(d) for _, d in sorted(gpu.TOOLKIT_DRIVER.items(), key=lambda kv: gpu.version_tuple(kv[0]))]
    assert drivers == sorted(drivers)
    for major, floor in gpu.MINOR_COMPAT_DRIVER.items():
        assert gpu.version_tuple(floor) <= gpu.version_tuple(gpu.TOOLKIT_DRIVER[f"{major}.0"]) or major == 11


# --- a scripted GPU node ------------------------------------------------------------------------


class Node:
    """Answers commands like a GPU node would, from a script of (argv prefix -> answer); records calls."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        best = max((p for p in self.answers if tuple(argv[: len(p)]) == p), key=len, default=None)
        if best is None:
            raise AssertionError(f"unscripted command {argv}")
        code, out, err = self.answers[best]
        return subprocess.CompletedProcess(argv, code, out, err)


QUERY = ("nvidia-smi", "--query-gpu=" + ",".join(gpu.QUERY_FIELDS), "--format=csv,noheader")
INSPECT = ("docker", "image", "inspect")
CONTAINER = ("docker", "run")


def labels(tensorflow: str | None = "12.2", torch: str | None = "12.8") -> tuple[int, str, str]:
    """``docker image inspect --format '{{json .Config.Labels}}'`` of a CUDA image labelled with these CUDA releases."""
    found = {"org.edgetrain.tensorflow.version": "2.15.1", "org.edgetrain.torch.version": "2.9.1"}
    found.update({label: cuda for label, cuda in ((gpu.CUDA_LABEL, tensorflow), (gpu.TORCH_CUDA_LABEL, torch)) if cuda})
    return 0, json.dumps(found) + "\n", ""


def h100_node(override: dict | None = None) -> Node:
    answers = {
        ("nvidia-smi",): (0, SMI, ""),
        QUERY: (0, QUERY_NOHEADER, ""),
        INSPECT: labels(),
        CONTAINER: (0, SMI_L, ""),
    }
    answers.update(override or {})
    return Node(answers)


def test_check_node_on_the_captured_h100():
    node = h100_node()
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert result.driver_version == "580.159.04" and result.cuda_version == "13.0"
    assert [g.uuid for g in result.gpus] == [UUID] and [g.uuid for g in result.container_gpus] == [UUID]
    assert [(d.stack, d.image_cuda, d.mode) for d in result.drivers] == [("TensorFlow", "12.2", "native"), ("torch", "12.8", "native")]
    assert result.warnings == ()
    assert result.summary() == ("1 x NVIDIA H100 80GB HBM3; driver 580.159.04 (CUDA 13.0) for TensorFlow's CUDA 12.2, "
                                "torch's CUDA 12.8; 1 visible in a container")
    # The container check asks the node's engine for the image it has, never a registry.
    run = next(c for c in node.calls if c[:2] == ["docker", "run"])
    assert run == ["docker", "run", "--rm", "--gpus", "all", "--pull", "never", "--network", "none",
                   "--entrypoint", "nvidia-smi", IMAGE, "-L"]
    assert node.calls[2] == ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", IMAGE]


def test_more_slots_than_gpus():
    with pytest.raises(EdgetrainError) as e:
        gpu.check_node(h100_node(), "gpu1", image=IMAGE, slots=2)
    assert str(e.value) == "gpu1: 2 slots but 1 GPU(s): every rank needs a GPU of its own - set edgetrain_slots: 1 for gpu1 in the inventory"


def test_two_gpus_cover_two_slots():
    node = h100_node({("nvidia-smi",): (0, smi_table("580.159.04", "13.0", 2), ""), QUERY: (0, two_gpu(QUERY_NOHEADER), ""),
                        CONTAINER: (0, two_gpu(SMI_L), "")})
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=2)
    assert [g.index for g in result.gpus] == [0, 1] and len(result.container_gpus) == 2


def test_container_sees_fewer_gpus_than_the_host():
    node = h100_node({QUERY: (0, two_gpu(QUERY_NOHEADER), "")})
    with pytest.raises(EdgetrainError, match=r"^gpu1: a container sees 1 of the host's 2 GPUs - check the NVIDIA container toolkit"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=2)


def test_nvidia_smi_missing():
    node = h100_node({("nvidia-smi",): (127, "", "bash: line 1: nvidia-smi: command not found\n")})
    with pytest.raises(EdgetrainError, match=r"^gpu1: nvidia-smi not found: no NVIDIA driver is installed - install the NVIDIA driver"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert node.calls == [["nvidia-smi"]]


def test_nvidia_smi_missing_on_a_local_host():
    def local(argv):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    with pytest.raises(EdgetrainError, match="^localhost: nvidia-smi not found"):
        gpu.check_node(local, "localhost", image=IMAGE, slots=1)


def test_driver_not_loaded():
    node = h100_node({("nvidia-smi",): (9, NO_DRIVER, "")})
    with pytest.raises(EdgetrainError, match=r"^gpu1: nvidia-smi cannot talk to the NVIDIA driver \(exit 9\).* - load the driver"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)


def test_driver_too_old_for_the_image():
    node = h100_node({("nvidia-smi",): (0, smi_table("520.61.05", "11.8"), "")})
    with pytest.raises(EdgetrainError) as e:
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    # Both stacks refuse it; one upgrade serves both: the driver of the newer CUDA, torch's 12.8.
    assert str(e.value) == ("gpu1: NVIDIA driver 520.61.05 is too old for CUDA 12.2 of the image's TensorFlow (needs >= 525.60.13; "
                            ">= 535.54.03 for all of CUDA 12.2); driver 520.61.05 is too old for CUDA 12.8 of the image's torch "
                            "(needs >= 525.60.13; >= 570.26 for all of CUDA 12.8) - upgrade the node's NVIDIA driver to >= 570.26 (CUDA 12.8 in full)")
    # Refused before any container was started.
    assert not any(c[:2] == ["docker", "run"] for c in node.calls)


def test_driver_in_minor_version_compatibility_warns():
    node = h100_node({("nvidia-smi",): (0, smi_table("530.30.02", "12.1"), "")})
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert [d.mode for d in result.drivers] == ["minor-version-compatibility"] * 2
    assert result.warnings == ("gpu1: driver 530.30.02 runs CUDA 12.2 of the image's TensorFlow through CUDA minor version compatibility "
                               "(>= 525.60.13); CUDA 12.2 in full needs >= 535.54.03",
                               "gpu1: driver 530.30.02 runs CUDA 12.8 of the image's torch through CUDA minor version compatibility "
                               "(>= 525.60.13); CUDA 12.8 in full needs >= 570.26")


def test_a_driver_native_for_tensorflow_warns_for_torchs_newer_cuda_alone():
    # A CUDA 12.4 driver: TensorFlow's 12.2 in full, torch's 12.8 only through minor version compatibility.
    node = h100_node({("nvidia-smi",): (0, smi_table("550.54.14", "12.4"), "")})
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert [(d.stack, d.mode) for d in result.drivers] == [("TensorFlow", "native"), ("torch", "minor-version-compatibility")]
    assert result.warnings == ("gpu1: driver 550.54.14 runs CUDA 12.8 of the image's torch through CUDA minor version compatibility "
                               "(>= 525.60.13); CUDA 12.8 in full needs >= 570.26",)


def test_image_label_decides_the_cuda_version():
    # An image labelled for CUDA 13.0 on a 12.2 driver: refused by the label, not by IMAGE_CUDA.
    node = h100_node({("nvidia-smi",): (0, smi_table("535.104.05", "12.2"), ""), INSPECT: labels("13.0", None)})
    with pytest.raises(EdgetrainError, match="too old for CUDA 13.0 of the image's TensorFlow"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)


def test_a_driver_that_runs_tensorflow_but_not_torch_is_refused_naming_torch():
    # A torch built for CUDA 13 (PyPI's 2.13) on a CUDA 12.9 driver: TensorFlow's 12.2 runs, torch's cannot.
    node = h100_node({("nvidia-smi",): (0, smi_table("575.51.03", "12.9"), ""), INSPECT: labels("12.2", "13.0")})
    with pytest.raises(EdgetrainError) as e:
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert str(e.value) == ("gpu1: NVIDIA driver 575.51.03 is too old for CUDA 13.0 of the image's torch (needs >= 580.65.06) - "
                            "upgrade the node's NVIDIA driver to >= 580.65.06 (CUDA 13.0 in full)")
    assert not any(c[:2] == ["docker", "run"] for c in node.calls)


@pytest.mark.parametrize("answer", [labels(torch=None), (0, "null\n", "")])
def test_an_image_without_torchs_cuda_label_is_checked_for_tensorflows(answer):
    # Built before torch's CUDA was labelled, or a site's own image (no labels at all: IMAGE_CUDA).
    node = h100_node({("nvidia-smi",): (0, smi_table("535.54.03", "12.2"), ""), INSPECT: answer})
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert [(d.stack, d.image_cuda, d.mode) for d in result.drivers] == [("TensorFlow", gpu.IMAGE_CUDA, "native")]


def test_image_missing_on_the_node():
    node = h100_node({INSPECT: (1, "", f"Error: No such image: {IMAGE}\n")})
    with pytest.raises(EdgetrainError, match=r"^gpu1: image edgetrain:0.1.0-cuda is not in its Docker engine - edgetrain images distribute"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)


def test_old_driver_without_compute_cap_falls_back():
    # Drivers that do not know a field answer like the captured bad-field case (exit 2).
    bad = ("nvidia-smi", "--query-gpu=" + ",".join(gpu.QUERY_FIELDS), "--format=csv,noheader")
    fewer = ("nvidia-smi", "--query-gpu=" + ",".join(gpu.QUERY_FIELDS[:-1]), "--format=csv,noheader")
    node = h100_node({bad: (2, QUERY_BAD_FIELD.replace("bogus", "compute_cap"), ""),
                        fewer: (0, QUERY_NOHEADER.rsplit(",", 1)[0] + "\n", "")})
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1)
    assert result.gpus[0].compute_cap is None and result.gpus[0].memory_mib == 81559
    assert [c for c in node.calls if c[0] == "nvidia-smi" and len(c) > 1] == [list(bad), list(fewer)]


def test_gpu_too_old_for_the_image():
    node = h100_node({QUERY: (0, QUERY_NOHEADER.replace("H100 80GB HBM3", "Tesla P100-PCIE-16GB").replace("9.0", "6.0"), "")})
    with pytest.raises(EdgetrainError, match=r"^gpu1: GPU 0 \(NVIDIA Tesla P100-PCIE-16GB\) has compute capability 6.0; the image has GPU code for >= 7.0"):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n',
         r"^gpu1: Docker cannot give containers GPUs .* - install the NVIDIA container toolkit .*--tags docker --limit gpu1$"),
        ("docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: "
         "runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: "
         "exit status 1, stdout: , stderr: nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.\n",
         r"^gpu1: the NVIDIA container runtime failed: .*nvml error: driver not loaded.* - check the driver and the toolkit"),
        ('docker: Error response from daemon: failed to create task for container: exec: "nvidia-smi": executable file not found in $PATH: unknown.\n',
         r"^gpu1: the NVIDIA runtime gave the container no nvidia-smi .* - .*NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
    ],
)
def test_container_runtime_failures(stderr, expected):
    node = h100_node({CONTAINER: (125, "", stderr)})
    with pytest.raises(EdgetrainError, match=expected):
        gpu.check_node(node, "gpu1", image=IMAGE, slots=1)


def test_without_the_container_check_no_docker_command_runs():
    node = h100_node()
    result = gpu.check_node(node, "gpu1", image=IMAGE, slots=1, check_container=False)
    assert result.container_gpus == () and all(c[0] == "nvidia-smi" for c in node.calls)


def test_check_host_runs_through_a_nodes_session_with_the_hosts_image_and_slots():
    from edgetrain.controller.inventory import Host

    class Nodes:  # edgetrain.controller.remote.Nodes as check_host uses it
        def __init__(self):
            self.node = h100_node()
            self.hosts = []

        def run(self, host, argv):
            self.hosts.append(host.name)
            return self.node(argv)

    host = Host(name="gpu1", address="198.18.0.21", arch="x86_64", slots=2, runtime="docker", groups=frozenset({"gpu"}))
    nodes = Nodes()
    with pytest.raises(EdgetrainError, match="^gpu1: 2 slots but 1 GPU"):
        gpu.check_host(nodes, host)
    assert set(nodes.hosts) == {"gpu1"}
    # The image of a gpu host is the CUDA image unless the inventory names one.
    inspect = next(c for c in nodes.node.calls if c[:3] == ["docker", "image", "inspect"])
    assert inspect[-1] == f"edgetrain:{gpu_version()}-cuda"
    one = Host(name="gpu1", address="198.18.0.21", arch="x86_64", slots=1, runtime="docker", groups=frozenset({"gpu"}), image="site/cuda:1")
    again = Nodes()
    assert gpu.check_host(again, one).container_gpus[0].uuid == UUID
    assert [c[-2] for c in again.node.calls if c[:2] == ["docker", "run"]] == ["site/cuda:1"]


def gpu_version() -> str:
    from edgetrain import __version__
    return __version__


# --- one GPU per rank ---------------------------------------------------------------------------


class FakeDevice:
    def __init__(self, index: int) -> None:
        self.name = f"/physical_device:GPU:{index}"
        self.device_type = "GPU"


class FakeTf:
    """tf.config.experimental as far as pin_gpu uses it, with TensorFlow's refusal once devices are initialised."""

    def __init__(self, ngpus: int, initialized: bool = False) -> None:
        self.devices = [FakeDevice(i) for i in range(ngpus)]
        self.growth: dict[str, bool] = {}
        self.visible: list[str] | None = None
        self.initialized = initialized
        self.config = self
        self.experimental = self

    def list_physical_devices(self, device_type=None):
        assert device_type == "GPU"
        return list(self.devices)

    def set_memory_growth(self, device, enable):
        if self.initialized:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable

    def set_visible_devices(self, devices, device_type=None):
        assert device_type == "GPU"
        devices = devices if isinstance(devices, list) else [devices]
        self.visible = [d.name for d in devices]


def test_pin_gpu_two_ranks_on_a_two_gpu_host():
    pinned = []
    for local_rank in (0, 1):
        tf = FakeTf(2)  # each rank is its own process with its own TensorFlow
        assert pin.pin_gpu(tf, local_rank) == f"/physical_device:GPU:{local_rank}"
        assert tf.growth == {"/physical_device:GPU:0": True, "/physical_device:GPU:1": True}
        pinned.append(tf.visible)
    assert pinned == [["/physical_device:GPU:0"], ["/physical_device:GPU:1"]]


def test_pin_gpu_without_gpus_changes_nothing():
    tf = FakeTf(0)
    assert pin.pin_gpu(tf, 3) is None
    assert tf.visible is None and tf.growth == {}


def test_pin_gpu_more_ranks_than_gpus():
    tf = FakeTf(2)
    with pytest.raises(EdgetrainError) as e:
        pin.pin_gpu(tf, 2)
    assert str(e.value) == ("local rank 2 has no GPU of its own: this host shows 2 GPU(s) - "
                            "give the host at most 2 slot(s) (edgetrain_slots) so each rank gets one GPU")
    assert tf.visible is None


def test_pin_gpu_after_tensorflow_started_is_explained():
    with pytest.raises(EdgetrainError, match="call pin_gpu before TensorFlow creates any tensor"):
        pin.pin_gpu(FakeTf(1, initialized=True), 0)


def test_pin_gpu_with_the_real_tensorflow_on_a_machine_without_gpus():
    tf = pytest.importorskip("tensorflow")
    assert tf.config.list_physical_devices("GPU") == []
    assert pin.pin_gpu(tf, 0) is None
    assert [d.device_type for d in tf.config.get_visible_devices()] == ["CPU"]


def test_gpu_module_does_not_import_tensorflow():
    proc = subprocess.run([sys.executable, "-c", "import sys, edgetrain.controller.gpu; print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path(gpu.__file__).parents[1])})
    assert proc.stdout.strip() == "False"
