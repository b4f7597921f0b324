"""The push's `docker load` on a node keeps its pid while it reads, so that an interrupted
push ends its own loads (`end_loads_command`): the command builders, run in a real shell
with a stand-in `docker` on PATH and HOME in a temporary folder."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from provisioner.runtime.docker.direct import LOADS_DIR, end_loads_command, load_command

PUSH = "0123abcd0123abcd"
# a stand-in `docker`: `docker load` copies its stdin to a file and exits 3 (so that the
# status is seen to come through), after what it read ended
FAKE = """#!/bin/sh
[ "$1" = load ] || exit 9
cat > "$HOME/loaded"
exit 3
"""


@pytest.fixture()
def node(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE)
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def pid_files(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["HOME"]) / LOADS_DIR).glob(f"{PUSH}.*"))


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_load_reads_stdin_exits_with_its_status_and_leaves_no_pid_file(
    node: dict[str, str], shell: str
) -> None:
    run = subprocess.run(
        [shell, "-c", load_command(PUSH)], input=b"the stream", env=node, timeout=30
    )
    assert run.returncode == 3
    assert (Path(node["HOME"]) / "loaded").read_bytes() == b"the stream"
    assert (Path(node["HOME"]) / LOADS_DIR).is_dir() and pid_files(node) == []


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_an_interrupted_push_ends_its_load_still_reading(node: dict[str, str], shell: str) -> None:
    # the stream stays open (nothing more comes): the load reads on until it is ended
    load = subprocess.Popen([shell, "-c", load_command(PUSH)], stdin=subprocess.PIPE, env=node)
    other = subprocess.Popen(  # another push's load on the same node is left alone
        [shell, "-c", load_command("ffff0000ffff0000")], stdin=subprocess.PIPE, env=node
    )
    try:
        deadline = time.monotonic() + 20
        while not pid_files(node) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pid_files(node)) == 1  # positive control: it holds its pid while it reads
        time.sleep(0.5)
        assert load.poll() is None
        ended = subprocess.run([shell, "-c", end_loads_command(PUSH)], env=node, timeout=30)
        assert ended.returncode == 0
        assert load.wait(20) != 0  # ended, not finished
        assert pid_files(node) == []
        assert other.poll() is None  # still reading
    finally:
        for proc in (load, other):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_ending_the_loads_of_a_push_with_none_left_does_nothing(node: dict[str, str]) -> None:
    ended = subprocess.run(["sh", "-c", end_loads_command(PUSH)], env=node, timeout=30)
    assert ended.returncode == 0


@pytest.mark.parametrize("bad", ["", "$(touch x)", "0123abcd; rm", "ABCDEF0123", "0123abc\n"])
def test_a_push_id_is_hex_only(bad: str) -> None:
    with pytest.raises(ValueError):
        load_command(bad)
    with pytest.raises(ValueError):
        end_loads_command(bad)
