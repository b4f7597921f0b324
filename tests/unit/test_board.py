"""TensorBoard on the head: the script `tunnel` runs where Ray runs (here with this
machine's Python, which has no tensorboard), and the judging of its answer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from provisioner.cluster.board import MARK, judge, parse_board
from provisioner.cluster.board_head import board_args

SCRIPT = Path(__file__).resolve().parents[2] / "provisioner" / "cluster" / "board_head.py"


def run_script(*args: str, root: Path | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PROVISIONER_RESULTS_ROOT"}
    if root is not None:
        env["PROVISIONER_RESULTS_ROOT"] = str(root)
    done = subprocess.run(
        [sys.executable, "-", *args],
        input=SCRIPT.read_bytes(),
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    )
    found = parse_board(done.stdout.decode())
    assert found is not None, done.stdout + done.stderr
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_tensorboard_it_says_so_and_names_the_python(tmp_path: Path) -> None:
    found = run_script("serve", str(free_port()), root=tmp_path / "results")
    assert found == {"state": "missing", "python": sys.executable}
    in_image = judge(found, 29009, in_image=True)
    assert not in_image.serving and "image build" in in_image.fix and "up" in in_image.fix
    on_host = judge(found, 29009, in_image=False)
    assert f"{sys.executable} -m pip install tensorboard" in on_host.fix


def test_a_port_already_listened_on_is_left_to_the_tunnels_owner_check(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        found = run_script("serve", str(port), root=tmp_path)
    assert found == {"state": "running", "logdir": str(tmp_path)}
    assert judge(found, port, in_image=True).serving
    # positive control: the same port free again is not taken for a running one
    assert run_script("serve", str(port), root=tmp_path)["state"] == "missing"


def test_without_the_results_root_it_fails_with_the_reason() -> None:
    found = run_script("serve", str(free_port()), root=None)
    assert found["state"] == "failed" and "PROVISIONER_RESULTS_ROOT" in str(found["error"])
    board = judge(found, 1, in_image=True)
    assert not board.serving and board.fix


def test_stop_ends_only_a_tensorboard_on_that_port() -> None:
    port = free_port()
    # a process whose command line is TensorBoard's on PORT (python -c ignores the rest)
    looks_like = ["-c", "import time; time.sleep(120)", "-m", "tensorboard.main"]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    board = subprocess.Popen([sys.executable, *looks_like, "--port", str(port)])
    try:
        assert run_script("stop", str(other.pid), str(port), root=None) == {"state": "gone"}
        assert other.poll() is None  # not TensorBoard: left alone
        wrong_port = str(port + 1)
        assert run_script("stop", str(board.pid), wrong_port, root=None) == {"state": "gone"}
        assert board.poll() is None
        assert run_script("stop", str(board.pid), str(port), root=None) == {"state": "stopped"}
        assert board.wait(30) != 0  # ended by the signal
    finally:
        for proc in (other, board):
            proc.kill()
            proc.wait()


def listener(port: int, on_term: str) -> subprocess.Popen[bytes]:
    """A process with TensorBoard's command line that listens on PORT; on SIGTERM it runs
    `on_term` (python), then exits (unless `on_term` ignores the signal)."""
    code = (
        "import signal, socket, sys, time\n"
        f"def term(*_):\n    {on_term}\n"
        "signal.signal(signal.SIGTERM, term)\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "-m", "tensorboard.main", "--port", str(port)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_stop_answers_only_once_the_port_is_free() -> None:
    """A TensorBoard that takes its time to end (2 s after SIGTERM): `stop` waits for it,
    so the tunnel's end means the port is free (CI once saw it still listening)."""
    port = free_port()
    slow = listener(port, "time.sleep(2); sys.exit(0)")
    try:
        assert listens(port)  # positive control
        assert run_script("stop", str(slow.pid), str(port), root=None) == {"state": "stopped"}
        assert not listens(port)
    finally:
        slow.kill()
        slow.wait()


def test_one_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    port = free_port()
    stubborn = listener(port, "pass")
    try:
        got = run_script("stop", str(stubborn.pid), str(port), "1", root=None)
        assert got == {"state": "killed", "error": ""}
        assert not listens(port) and stubborn.wait(10) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()


def test_tensorboard_listens_on_the_heads_loopback_only() -> None:
    args = board_args("/opt/ray/bin/python", "/provisioner/results", 29009)
    assert args == [
        "/opt/ray/bin/python", "-m", "tensorboard.main", "--logdir", "/provisioner/results",
        "--host", "127.0.0.1", "--port", "29009",
    ]  # fmt: skip


def test_parse_board_reads_the_marked_line_after_other_output() -> None:
    out = f"some warning\n{MARK}" + '{"state": "started", "pid": 7}\n'
    assert parse_board(out) == {"state": "started", "pid": 7}
    assert parse_board("no mark here\n") is None
    board = judge({"state": "started", "pid": 7, "logdir": "/r"}, 29009, in_image=True)
    assert board.serving and board.pid == 7 and board.logdir == "/r"
