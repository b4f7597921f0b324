"""The push's end ends any chain hop still running on a node (a round cut off mid-stream)
with its whole process group, then removes the relay dir; run in a real shell with a
stand-in hop started as sshd starts a session's command (a group of its own)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from provisioner.runtime.docker.chain_plan import HOP_PIDS, remove_relay_dir_command

# a stand-in hop: records its pid as the real one does, then waits on a pipeline (as a
# hop's tee | docker load waits on a stream that never ends)
HOP = f"""cd "$(dirname "$0")" || exit 1
echo $$ >> {HOP_PIDS}
sleep 300 | cat
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    return state != "Z"


def group_of(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "-g", str(os.getpgid(pid))], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_a_hop_left_running_is_ended_with_its_group_and_the_dir_removed(
    tmp_path: Path, shell: str
) -> None:
    relay = tmp_path / "relay"
    relay.mkdir()
    (relay / "hop").write_text(HOP)
    hop = subprocess.Popen(["setsid", "sh", str(relay / "hop")])
    other = subprocess.Popen(["sleep", "300"])  # not the hop: left alone
    try:
        deadline = time.monotonic() + 20
        while not (relay / HOP_PIDS).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        members = group_of(hop.pid)
        assert len(members) >= 3  # positive control: the hop, its sleep and its cat run
        with (relay / HOP_PIDS).open("a") as f:
            f.write(f"{other.pid}\nnot-a-pid\n")
        done = subprocess.run([shell, "-c", remove_relay_dir_command(str(relay))], timeout=30)
        assert done.returncode == 0
        hop.wait(20)
        deadline = time.monotonic() + 20
        while any(alive(p) for p in members) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in members)
        assert not relay.exists()
        assert other.poll() is None
    finally:
        for proc in (hop, other):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_relay_dir_without_hops_is_just_removed(tmp_path: Path) -> None:
    relay = tmp_path / "relay"
    relay.mkdir()
    (relay / "x").write_text("x")
    done = subprocess.run(["sh", "-c", remove_relay_dir_command(str(relay))], timeout=30)
    assert done.returncode == 0 and not relay.exists()
