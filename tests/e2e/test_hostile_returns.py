"""What comes home from nodes and jobs, when they are hostile (issue 20), on the lab.

A job that leaves links and special files in its results and prints terminal escapes; a
node whose `tar` answers log collection with a hostile archive during `down`; known_hosts
with `@revoked` and `@cert-authority` lines.
Each ends in a clear message and exit code, nothing is written outside its target, and
every fault is undone. (The relay key's byte-for-byte cleanup is in test_image_push.py.)
"""

from __future__ import annotations

import base64
import io
import json
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from tests.e2e.faults.lab import cli, edited_inventory, on_node
from tests.e2e.faults.record import scenario

TERMINAL_BYTES = ("\x1b", "\x07", "\x9b", "\r")


@pytest.fixture(scope="module")
def inv(cluster_inventory: Path) -> Iterator[str]:
    """The lab cluster, up (idempotent)."""
    run = cli("up", "-i", str(cluster_inventory), "--json")
    assert run.code == 0, run.stderr[-3000:]
    yield str(cluster_inventory)


def snapshot(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_known_hosts_markers_are_handled(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    inventory = load_inventory(Path(inv))
    (source,) = inventory.nodes[0].ssh.known_hosts[:1]
    worker = lab.nodes[1]
    lines = source.read_text().splitlines()
    revoked = [
        f"@revoked * {' '.join(line.split()[1:3])}"
        for line in lines
        if line.split()[0] == worker.address
    ]
    assert revoked
    marked = tmp_path / "known_hosts"
    marked.write_text(
        "\n".join(
            [
                "@cert-authority *.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBadKey",
                *revoked,
                *lines,
            ]
        )
        + "\n"
    )
    edited = edited_inventory(Path(inv), tmp_path / "inv.yaml", ssh={"known_hosts": str(marked)})
    with scenario(
        "known_hosts holds an @cert-authority line and @revoked keys of one worker",
        "no crash: the other nodes are checked as usual; the worker is refused with a "
        "clear error naming @revoked (exit 1)",
        kind="security",
    ) as s:
        run = cli("status", "-i", str(edited), "--json")
        s.expect("exit", run.code, 1, run.stderr[-2000:])
        s.expect("traceback", "Traceback" in run.stderr, False, run.stderr[-2000:])
        nodes = {n["name"]: n for n in json.loads(run.stdout)["nodes"]}
        refused = nodes.pop(worker.name)
        s.expect("ssh_ok", refused["ssh_ok"], False, str(refused))
        s.expect("revoked", "@revoked" in refused["error"], True, str(refused))
        assert all(n["ssh_ok"] and n["container"] == "running" for n in nodes.values()), nodes
        s.saw(others=len(nodes))
        s.observed = (
            "status exit {exit}: the worker's ssh_ok {ssh_ok}, its error naming @revoked: "
            "{revoked}; the {others} other nodes checked as usual (ssh ok, container running); "
            "a traceback: {traceback}"
        )


LINKS_BOOK = """
import os, pathlib
d = pathlib.Path(os.environ["PROVISIONER_RESULTS_DIR"])
(d / "sub").mkdir(parents=True)
(d / "metrics.csv").write_bytes(b"iteration,env_steps\\xff\\n1,\\xfe2\\n")
(d / "summary.json").write_text('{"ok": 1}')
(d / "passwd").symlink_to("/etc/passwd")
(d / "up").symlink_to("..")
(d / "sub" / "home").symlink_to(os.path.expanduser("~"))
os.mkfifo(d / "pipe")
print("secrets on the cluster:", [p for p in ("id_ed25519", ".env") if os.path.exists(p)])
print("\\x1b]0;pwned\\x07\\x1b[2J [/tmp/x] [bold red]not markup[/] \\x9b31m\\rend", flush=True)
"""


def test_a_job_leaving_links_and_escapes_brings_only_its_files_home(
    inv: str, tmp_path: Path
) -> None:
    book = tmp_path / "book"
    book.mkdir()
    (book / "links.py").write_text(LINKS_BOOK)
    (book / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot sent\n")
    (book / ".env").write_text("API_KEY=not-sent\n")
    with scenario(
        "a job leaves links and a FIFO in its results, prints terminal escapes and markup",
        "exit 0; its regular files come home 0600 in 0700 folders, the links and the FIFO "
        "stay on the head; the escapes are shown, not sent to the terminal; secrets beside "
        "the playbook never reach the cluster",
        kind="security",
    ) as s:
        run = cli(
            "submit",
            "-i",
            inv,
            "--verbose",
            "--results",
            str(tmp_path / "r"),
            str(book / "links.py"),
        )
        shown = run.stdout + run.stderr
        s.expect("exit", run.code, 0, shown[-3000:])
        (job,) = (tmp_path / "r").iterdir()
        home = snapshot(job)
        assert {"metrics.csv", "summary.json", "job.log", "training.png"} <= home, home
        s.expect(
            "left",
            sorted({"passwd", "up", "sub/home", "pipe"} - home),
            ["passwd", "pipe", "sub/home", "up"],
        )
        modes, links = set(), 0
        for path in (job, *job.rglob("*")):
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
            assert not path.is_symlink(), path
            modes.add(oct(mode))
            links += path.is_symlink()
        s.expect("links", links, 0)
        s.saw(
            home=sorted(home & {"metrics.csv", "summary.json", "job.log", "training.png"}),
            modes=modes,
        )
        found = [c for c in TERMINAL_BYTES if c in shown]
        s.expect("escapes", len(found), 0, repr(found))
        s.expect("markup", "[/tmp/x] [bold red]not markup[/]" in shown, True)
        s.expect("shown", " [/tmp/x] [bold red]not markup[/] 31m" in shown, True)
        s.expect("dropped", "pwned" in shown, False)
        s.expect("on_cluster", "secrets on the cluster: []" in shown, True)
        s.expect("secrets", "left out as secrets: .env, id_ed25519" in run.stderr, True)
        s.observed = (
            "exit {exit}; home: {home} (among others), every file and folder mode in {modes}, "
            "{links} links; not brought home (left on the head): {left}; no terminal control "
            "byte shown: {escapes} found; the escapes dropped ({dropped}: `pwned` shown), the rest "
            "of the line shown: {shown}; "
            "markup shown as text: {markup}; the job saw no secret beside the playbook: "
            "{on_cluster}; `left out as secrets: .env, id_ed25519` said: {secrets}"
        )


def hostile_logs_tar(outside: Path) -> bytes:
    """A tar a hostile node could send: a good file, then links out to `outside`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        good = tarfile.TarInfo("./container.log")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"ok\n"))
        link = tarfile.TarInfo("./escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        bashrc = tarfile.TarInfo("./escape/.bashrc")
        bashrc.size = 11
        tar.addfile(bashrc, io.BytesIO(b"echo pwned\n"))
    return buffer.getvalue()


FAKE_TAR = """#!/bin/sh
case "$*" in *-czf*) base64 -d /tmp/hostile-logs.b64; exit 0;; esac
exec /bin/tar "$@"
"""


def test_a_node_answering_down_with_a_hostile_tar(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    worker = lab.nodes[1]
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / ".bashrc").write_text("mine\n")
    blob = base64.b64encode(hostile_logs_tar(outside)).decode()
    with scenario(
        f"{worker.name}'s `tar` answers log collection with links out of the logs folder",
        "down refuses that node's logs with a clear error (exit 1), collects the others, "
        "still stops Ray on every node; nothing written outside the logs folder",
        kind="security",
    ) as s:
        on_node(
            worker,
            f"echo {blob} > /tmp/hostile-logs.b64 && "
            f"cat > /usr/local/bin/tar <<'EOF'\n{FAKE_TAR}EOF\nchmod 755 /usr/local/bin/tar",
        )
        try:
            run = cli("down", "-i", inv, "-o", str(tmp_path / "logs"), "--json")
        finally:
            on_node(worker, "rm -f /usr/local/bin/tar /tmp/hostile-logs.b64")
        s.expect("exit", run.code, 1, run.stderr[-3000:])
        out = json.loads(run.stdout)
        names = {n.name for n in load_inventory(Path(inv)).nodes}
        assert set(out["removed"]) == names  # Ray stopped everywhere all the same
        refused = out["logs"]["errors"][worker.name]
        s.expect("link", "symbolic link" in refused, True, refused)
        assert set(out["logs"]["nodes"]) == names - {worker.name}
        s.expect("bashrc", (outside / ".bashrc").read_text(), "mine\n")
        s.expect("outside", sorted(snapshot(outside)), [".bashrc"])
        s.expect("worker_logs", (tmp_path / "logs" / worker.name).exists(), False)
        partial = [p for p in snapshot(tmp_path / "logs") if ".receiving" in p]
        s.expect("partial", len(partial), 0, repr(partial))
        assert all((tmp_path / "logs" / n / "container.log").exists() for n in out["logs"]["nodes"])
        s.saw(removed=len(out["removed"]), collected=len(out["logs"]["nodes"]))
        s.observed = (
            "exit {exit}; the worker's logs refused, its error naming a symbolic link: {link}; "
            "a logs folder for it: {worker_logs}; the {collected} other nodes' logs collected "
            "(container.log each); Ray removed from {removed} nodes; outside the logs folder "
            "only {outside}, its .bashrc still {bashrc!r}; partial downloads left: {partial}"
        )
