"""What shipping a project to a node's store may do to files, and how long it may take: a link ships
as its content and never changes what it points to, the store takes regular files only and keeps them
private and synced, a run sees only its own files, the store can be pruned, secrets stay home unless
asked for, and no node can hold the transfer forever. Over the 'local' connection of the embedded
default, with real files, tar streams and processes."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from edgetrain.controller import containers, node_store, shipping
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import Nodes
from edgetrain.shared import runs, workdir
from edgetrain.shared.errors import EdgetrainError
from tests.conftest import descendants, edgetrain


LOCAL = Host(name="localhost", address="localhost", arch="x86_64", slots=2, runtime="host", connection="local")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def digest_of(m: workdir.Manifest, rel: str) -> str:
    return next(e.sha256 for e in m.entries if e.path == rel)


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "train.py").chmod(0o755)
    return root


def test_a_link_to_a_private_file_ships_its_content_and_leaves_the_file_private(tmp_path, project):
    """The issue's first example: ~/secret/netrc (0600) linked into the project became 0644."""
    secret = tmp_path / "secret" / "netrc"
    secret.parent.mkdir()
    secret.write_text("machine example.org password hunter2\n")
    secret.chmod(0o600)
    (project / "cfg").symlink_to(secret)
    store = tmp_path / "runs" / ".store"
    m = workdir.scan(project)
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, str(store), m)
    assert mode(secret) == 0o600
    entry = store / digest_of(m, "cfg")
    assert stat.S_ISREG(os.lstat(entry).st_mode) and entry.read_text() == secret.read_text()


def hostile_archive(name: str, target: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, str(target)
        tar.addfile(info)
    return buf.getvalue()


def test_the_store_refuses_a_link_and_changes_no_mode_through_it(tmp_path):
    """An archive that names a link after its target's sha256 (what the old controller sent)."""
    target = tmp_path / "netrc"
    target.write_text("secret\n")
    target.chmod(0o600)
    name = workdir.sha256_file(target)
    store = tmp_path / ".store"
    proc = subprocess.run(shipping.node_command(LOCAL, "receive", str(store)), input=hostile_archive(name, target),
                          capture_output=True)
    assert proc.returncode == 1 and b"not a regular file" in proc.stderr
    assert mode(target) == 0o600 and list(store.iterdir()) == []


def test_a_link_in_the_stores_place_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / ".store").symlink_to(elsewhere)
    with pytest.raises(node_store.Refused, match="not a directory"):
        node_store.held(str(tmp_path / ".store"))
    assert mode(elsewhere) == 0o755


def test_shipped_files_and_run_directories_are_the_login_users_alone(tmp_path, project):
    store = tmp_path / "runs" / ".store"
    m = workdir.scan(project)
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, str(store), m)
    assert mode(store) == 0o700 and {mode(p) for p in store.iterdir()} == {0o400}
    work = tmp_path / "runs" / "r1" / "work"
    work.mkdir(parents=True)
    (work / ".train.py.edgetrain-tmp").symlink_to(project / "train.py")  # left by a script: never followed
    workdir.materialize(m, store, work)
    assert mode(work / "train.py") == 0o700 and mode(project / "train.py") == 0o755
    run = runs.create(tmp_path / "runs", "lenet")
    assert mode(run.path) == 0o700
    d = str(tmp_path / "node-runs" / "r2")
    subprocess.run(["sh", "-c", containers.private_dirs(d, containers.store_view(d))], check=True)
    assert mode(Path(d)) == 0o700 and mode(Path(containers.store_view(d))) == 0o700


def test_a_runs_container_sees_only_that_runs_files(tmp_path, project):
    other = tmp_path / "other"
    other.mkdir()
    (other / "private.py").write_text("KEY = 'another project'\n")
    runs_dir = tmp_path / "runs"
    store, mine, theirs = str(runs_dir / ".store"), workdir.scan(project), workdir.scan(other)
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, store, theirs)
        shipping.ship(nodes, LOCAL, store, mine)
        shipping.give_view(nodes, LOCAL, store, containers.store_view(str(runs_dir / "r1")), mine)
    view = Path(containers.store_view(str(runs_dir / "r1")))
    assert sorted(p.name for p in view.iterdir()) == sorted({e.sha256 for e in mine.entries})
    argv = containers.docker_run_argv(LOCAL, "edgetrain-r1", "r1", str(runs_dir / "r1"), "img", None)
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert f"{view}:{containers.STORE_MOUNT}:ro" in mounts and not any(m.startswith(f"{store}:") for m in mounts)


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_the_store_is_pruned_of_what_no_going_run_uses(tmp_path, project):
    old, kept = tmp_path / "old", project
    old.mkdir()
    (old / "gone.py").write_text("print('an old project')\n")
    runs_dir = tmp_path / "runs"
    store = str(runs_dir / ".store")
    with Nodes() as nodes:
        for run_id, root in (("r-old", old), ("r-live", kept)):
            m = workdir.scan(root)
            shipping.ship(nodes, LOCAL, store, m)
            shipping.give_view(nodes, LOCAL, store, containers.store_view(str(runs_dir / run_id)), m)
        for p in [*Path(store).iterdir(), *(runs_dir / ".views").iterdir()]:
            age(p, node_store.GRACE_SECONDS + 60)
        pruned = shipping.prune(nodes, LOCAL, str(runs_dir), {"r-live"})
    gone = digest_of(workdir.scan(old), "gone.py")
    assert (pruned.files, pruned.views) == (1, 1) and pruned.bytes == len("print('an old project')\n")
    assert sorted(p.name for p in Path(store).iterdir()) == sorted(e.sha256 for e in workdir.scan(kept).entries)
    assert not (runs_dir / ".views" / "r-old").exists() and gone not in os.listdir(store)


def test_edgetrain_clean_store_prunes_this_machines_store(tmp_path, project):
    runs_dir = tmp_path / "runs"
    store = str(runs_dir / ".store")
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, store, workdir.scan(project))
    for p in Path(store).iterdir():
        age(p, node_store.GRACE_SECONDS + 60)
    result = edgetrain("clean", "-i", "inventories/local", "--store", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    assert "localhost: file store: 1 file(s) removed" in result.stdout and os.listdir(store) == []


def test_names_that_look_like_secrets_stay_home_unless_asked_for(tmp_path, project):
    for rel in (".env", "certs/server.pem", "keys/id_ed25519", ".netrc", "conf/.env"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("secret\n")
    ssh_key = tmp_path / "id_rsa"
    ssh_key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (project / "deploy").symlink_to(ssh_key)  # judged by what it points to as well
    m = workdir.scan(project)
    assert [e.path for e in m.entries] == ["train.py"]
    assert sorted(m.withheld) == sorted([".env", ".netrc", "certs/server.pem", "conf/.env", "deploy", "keys/id_ed25519"])
    [note] = m.notes
    assert ".netrc" in note and "--ship-secrets" in note
    assert len(workdir.scan(project, secrets=True).entries) == 7
    (project / ".edgetrainignore").write_text("!.env\n")
    asked = workdir.scan(project)
    assert {".env", "conf/.env"} <= {e.path for e in asked.entries} and ".netrc" in asked.withheld
    assert "--ship-secrets" in edgetrain("run", "--help").stdout


def test_what_secret_scanners_flag_stays_home_and_the_run_names_it(tmp_path, project):
    """The names of workdir.SECRETS, by path, by a link named anything, and through a linked folder;
    what merely resembles them ships."""
    secret = [".env.local", ".git-credentials", ".pypirc", "certs/tls.key", "certs/client.P12", "certs/bundle.pfx",
              "keys/deploy.ppk", ".npmrc", ".docker/config.json", "conf/.kube/config", ".aws/credentials"]
    alike = ["config.json", "docker/config.json", "kube/config", "keys.py", "credentials.md"]
    for rel in secret + alike:
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("token = 0123456789abcdef\n")
    home = tmp_path / "home"
    for rel in (".aws/credentials", ".kube/config"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("aws_secret_access_key = 0123456789abcdef\n")
    (project / "settings.ini").symlink_to(home / ".aws/credentials")
    (project / "cluster").symlink_to(home / ".kube")  # ships as its files: cluster/config
    m = workdir.scan(project)
    assert sorted(e.path for e in m.entries) == sorted(["train.py", *alike])
    assert sorted(m.withheld) == sorted([*secret, "settings.ini", "cluster/config"])
    r = edgetrain("run", str(project / "train.py"), "--np", "1", "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    [note] = [line for line in r.stdout.splitlines() if line.startswith("left out of the working directory")]
    assert all(rel in note for rel in m.withheld) and "--ship-secrets" in note
    [run] = runs.all_runs(tmp_path / "runs")
    work = run.path / "work"
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == sorted(["train.py", *alike])


def test_a_private_key_under_any_name_stays_home(tmp_path, project):
    """A key is judged by its content too (the header secret scanners look for): saved as
    server.crt, pasted below a config's settings, PuTTY's; prose about keys ships."""
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" * 4
    keys = {"server.crt": f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\n",
            "conf/settings.txt": f"host = node1\nport = 22\n-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n",
            "deploy/access": "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"}
    prose = {"README.md": "Put your private key in ~/.ssh, never here.\n", "cert.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n"}
    for rel, text in {**keys, **prose}.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    m = workdir.scan(project)
    assert sorted(m.withheld) == sorted(keys)
    assert sorted(e.path for e in m.entries) == sorted(["train.py", *prose])
    assert len(workdir.scan(project, secrets=True).entries) == 1 + len(keys) + len(prose)
    (project / ".edgetrainignore").write_text("!server.crt\n")
    assert "server.crt" in {e.path for e in workdir.scan(project).entries}


def in_thread(fn) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def end_our_children() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_node_that_floods_stderr_cannot_hang_shipping(tmp_path):
    """A node whose clock is behind: GNU tar warns once per file of a time stamp in the future,
    and 1500 warnings filled the stderr pipe nobody read while the controller waited to write."""
    root = tmp_path / "proj"
    root.mkdir()
    future = time.time() + 10 * 365 * 86400
    for i in range(1500):
        (root / f"f{i:04d}.txt").write_text(f"{i}\n")
        os.utime(root / f"f{i:04d}.txt", (future, future))
    m = workdir.scan(root)
    with Nodes() as nodes:
        t, result = in_thread(lambda: shipping.ship(nodes, LOCAL, str(tmp_path / ".store"), m, timeout=60))
        t.join(30)
        if t.is_alive():
            end_our_children()
            t.join(10)
        assert not t.is_alive() and "error" not in result, result
    assert result["value"].files == 1500


def receiving(pid: int) -> bool:
    """Whether a process takes the stream into the store (not the listing before it): the store's
    receive, or the tar of a shell receiver."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"receive" in args or args[0] == b"tar" or any(b"tar -x" in a for a in args)


@pytest.mark.parametrize("deadline", [{"timeout": 3}, {"stall": 2}], ids=["whole transfer", "one write"])
def test_every_write_to_a_node_has_a_deadline(tmp_path, deadline):
    """The node stops reading (stopped, its disk hung): shipping ends with one error, not never."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "weights.bin").write_bytes(os.urandom(16 * 1024**2))
    m = workdir.scan(root)
    with Nodes() as nodes:
        t, result = in_thread(lambda: shipping.ship(nodes, LOCAL, str(tmp_path / ".store"), m, **deadline))
        # Every process of the receiving side, as soon as it exists. It starts after the node's
        # listing, which beside the suite's other lane once took over a second: a watch of a fixed
        # second missed it, and the 16 MiB went through (1.4 s, nothing stopped). So watch until one
        # is stopped, and half a second more for a shell receiver's tar.
        stopped: set[int] = set()
        give_up, settled = time.monotonic() + 30, None
        while t.is_alive() and time.monotonic() < (settled or give_up):
            for pid in set(descendants(os.getpid())) - stopped:
                if receiving(pid):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
                    settled = settled or time.monotonic() + 0.5
        t.join(20)
        hung = t.is_alive()
        end_our_children()
        t.join(10)
    assert stopped, f"no receiving process was seen while shipping ran: {result}"
    assert not hung, "shipping still waits on a node that reads nothing"
    assert isinstance(result.get("error"), EdgetrainError) and "shipping the working directory to localhost" in str(result["error"])
    assert list((tmp_path / ".store").glob("[0-9a-f]*")) == []


def test_an_empty_or_short_store_entry_is_not_taken_as_held(tmp_path, project):
    """Power lost after a rename that was never synced leaves a file named for content it lacks."""
    store = tmp_path / ".store"
    m = workdir.scan(project)
    store.mkdir()
    (store / digest_of(m, "train.py")).write_bytes(b"")
    with Nodes() as nodes:
        shipped = shipping.ship(nodes, LOCAL, str(store), m)
    assert shipped.files == 1 and (store / digest_of(m, "train.py")).read_text() == "print('hi')\n"


def test_the_store_syncs_each_file_and_itself_before_it_answers(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    data = b"weights\n"
    buf = io.BytesIO()
    digest = hashlib.sha256(data).hexdigest()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(digest)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    store = tmp_path / ".store"
    assert node_store.receive(str(store), buf) == 1
    assert any(Path(p).name.startswith(node_store.INCOMING + digest) for p in synced)  # the file, before its rename
    assert synced[-1] == str(store)  # then the directory that names it
