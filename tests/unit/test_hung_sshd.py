"""A hung sshd (issue 47, items 8 and 9), reproduced on this machine's loopback: a listener
whose kernel accepts the connection and that never speaks (a stopped sshd), or one that
sends a banner and then drops the connection. The library and the CLI run in a process
of their own, as a user runs them: only the tool's own lines reach stderr, and Ctrl-C
while `up` connects ends it at once. `beside`, which `up` runs its install with, is pure
logic, tested here too; tests/e2e/test_faults.py does both items with a lab node's sshd
stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.node import token
from provisioner.remote.fanout import beside

PROVISIONER = str(Path(sys.executable).parent / "provisioner")

# What paramiko wrote on stderr (its transport thread's records, through Python's
# last-resort handler) when such a connection ended.
LIBRARY_LINES = (
    "Traceback",
    "paramiko",
    "Exception (client)",
    "Socket exception",
    "Error reading SSH protocol banner",
)


def library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(m in line for m in LIBRARY_LINES)]


class Listener:
    """A TCP port on loopback: `silent` accepts and never speaks; `reset` sends an SSH
    banner, then resets the connection once the client's first bytes came."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(50)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.mode == "reset":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                # once the client's banner and its first packet came, unread, closing
                # sends a reset (mid-handshake)
                while not conn.recv(4096, socket.MSG_PEEK).partition(b"\n")[2]:
                    time.sleep(0.01)
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Listener]:
    listener = Listener("silent")
    yield listener
    listener.close()


@pytest.fixture
def reset() -> Iterator[Listener]:
    listener = Listener("reset")
    yield listener
    listener.close()


def key_file(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


# Session.connect in a process of its own (no logging configured, as a program that uses
# the library); it waits until paramiko's threads ended, then prints the tool's error.
CONNECT = """
import sys, threading
import paramiko
from pathlib import Path
from provisioner.errors import ProvisionerError
from provisioner.inventory import Node, SSHSettings
from provisioner.remote.session import Session

ssh = SSHSettings(user="u", port=int(sys.argv[1]), key=Path(sys.argv[2]), connect_timeout=1)
try:
    Session.connect(Node("w1", "127.0.0.1", "worker", ssh))
except ProvisionerError as exc:
    print(f"{exc} | fix: {exc.fix}")
for thread in threading.enumerate():
    if isinstance(thread, paramiko.Transport):
        thread.join(10)
"""


@pytest.mark.parametrize("mode", ["silent", "reset"])
def test_a_connection_to_a_hung_sshd_writes_nothing_on_stderr(
    mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    listener: Listener = request.getfixturevalue(mode)
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, str(listener.port), str(key_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # positive control: the tool's own error, naming the node, with a fix
    assert done.stdout.startswith("w1: "), done.stdout
    assert "fix: " in done.stdout and "fix: None" not in done.stdout, done.stdout
    assert done.stderr == "", done.stderr


def loopback_inventory(tmp_path: Path, ports: dict[str, int], connect_timeout: float) -> Path:
    """An inventory of nodes on loopback (name -> port); the first is the head."""
    names = list(ports)
    nodes = [{"name": n, "address": "127.0.0.1", "port": ports[n]} for n in names]
    document = {
        "cluster": "hung",
        "ssh": {
            "user": "lab",
            "key": str(key_file(tmp_path)),
            "known_hosts": str(tmp_path / "known_hosts"),
            "host_key_policy": "accept-new",
            "connect_timeout": connect_timeout,
        },
        "head": nodes[0],
        "workers": nodes[1:],
    }
    (tmp_path / "known_hosts").touch()
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def cli_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PROVISIONER_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}


@pytest.mark.parametrize("verb", ["doctor", "status", "up"])
def test_the_cli_shows_only_its_own_lines_for_a_hung_sshd(
    verb: str, tmp_path: Path, silent: Listener, reset: Listener
) -> None:
    inventory = loopback_inventory(tmp_path, {"h0": silent.port, "w1": reset.port}, 1)
    done = subprocess.run(
        [PROVISIONER, verb, "-i", str(inventory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=cli_env(tmp_path),
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert library_lines(done.stderr) == [], done.stderr[-3000:]
    # positive control: the tool's own lines name each node and what it did
    assert "h0" in text and "did not come within 1s" in text, text[-3000:]
    assert "w1" in text and f"SSH to lab@127.0.0.1:{reset.port} failed" in text, text[-3000:]
    if verb != "status":  # the doctor's findings carry their fix
        assert "fix: sshd on that machine is hung or overloaded" in text, text[-3000:]


def test_ctrl_c_while_up_connects_to_a_hung_sshd_ends_it_at_once(
    tmp_path: Path, silent: Listener
) -> None:
    other = Listener("silent")
    request_close = other.close
    """SIGINT during the doctor's round while both nodes' connections wait (a connect
    timeout of 60 s): `up` said it was interrupted and ended with 130. Before, it first
    waited for the token install beside the doctor's round, i.e. for the connect timeout."""
    inventory = loopback_inventory(tmp_path, {"h0": silent.port, "w1": other.port}, 60)
    proc = subprocess.Popen(
        [PROVISIONER, "up", "-i", str(inventory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "gathering facts" in line:
                break
        assert lines and "gathering facts" in lines[-1], "".join(lines)
        time.sleep(0.5)  # into the round's wait
        proc.send_signal(signal.SIGINT)
        try:  # a generous bound: the old wait was the whole connect timeout (60 s)
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError("`up` still running 20 s after SIGINT") from None
        stderr = "".join(lines) + proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        request_close()
    assert code == 130, stderr[-2000:]
    assert "interrupted" in stderr and "h0: " in stderr and "w1: " in stderr, stderr[-2000:]
    assert library_lines(stderr) == [], stderr[-2000:]


def test_beside_runs_its_work_while_the_block_runs_and_waits_for_it_on_leaving() -> None:
    gate = threading.Event()
    ran: list[str] = []

    def work() -> str:
        assert gate.wait(10)
        ran.append("work")
        return "done"

    with beside(work) as side:
        assert ran == []  # it waits for the gate, i.e. it runs beside the block
        gate.set()
    assert ran == ["work"] and side.result() == "done"


def test_beside_raises_its_error_from_result_and_the_block_error_first() -> None:
    def fails() -> None:
        raise ValueError("side")

    with beside(fails) as side:
        pass
    with pytest.raises(ValueError, match="side"):
        side.result()
    with pytest.raises(KeyError), beside(fails) as other:
        raise KeyError("block")  # the block's error, after the side ended
    assert isinstance(other.wait(), ValueError)


def test_beside_waits_for_its_work_when_the_block_fails() -> None:
    gate, ended = threading.Event(), threading.Event()

    def work() -> None:
        assert gate.wait(10)
        ended.set()

    opener = threading.Timer(0.2, gate.set)  # opens while the block's end waits
    opener.start()
    with pytest.raises(RuntimeError), beside(work):
        raise RuntimeError
    assert ended.is_set()
    opener.join()


def test_beside_does_not_wait_for_its_work_on_ctrl_c() -> None:
    gate, ended = threading.Event(), threading.Event()

    def work() -> None:
        assert gate.wait(10)
        ended.set()

    with pytest.raises(KeyboardInterrupt), beside(work) as side:
        raise KeyboardInterrupt
    assert not ended.is_set()  # the gate is still shut: nothing waited for the work
    gate.set()
    assert side.wait() is None and ended.is_set()  # it ran on, and ends when let


def test_a_token_install_cut_off_before_the_token_came_changes_nothing(tmp_path: Path) -> None:
    """Ctrl-C leaves `up`'s install behind and closes its connections: a node whose
    command had started but had not got the token yet sees stdin end empty."""
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    held = tmp_path / ".provisioner" / "clusters" / "c" / "auth_token"

    def install(data: str) -> int:
        command = ["bash", "-c", token.install_command("c")]
        return subprocess.run(command, input=data, text=True, env=env, check=False).returncode

    assert install("a" * 64) == 0 and held.read_text() == "a" * 64  # positive control
    assert install("") != 0
    assert held.read_text() == "a" * 64
