"""Issue 30's CLI mismatches: `lab fault break --list` without a node, and --json on
`render` and `tunnel` (the commands that report)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provisioner.cli import run
from provisioner.cli.cluster import ray_env_lines, tunnel_doc
from provisioner.cluster.board import Board
from provisioner.lab import faults
from tests.unit.test_slurm import SLURM_INV

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"


def test_fault_break_list_needs_no_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["lab", "fault", "break", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{key}: " in out for key in faults.BREAKAGES), out
    assert run(["lab", "fault", "break", "--list", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == set(faults.BREAKAGES)


def test_fault_break_without_anything_is_still_a_usage_error_elsewhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # positive control: mend still needs its NODE and WHAT, so a missing argument is exit 2
    assert run(["lab", "fault", "mend"]) == 2


@pytest.fixture
def slurm_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    key = tmp_path / "id_ed25519"
    key.write_text("not checked here\n")
    os.chmod(key, 0o600)
    path = tmp_path / "inv.yaml"
    path.write_text(SLURM_INV)
    return path


def test_render_json_names_what_was_written(
    slurm_inventory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "job.sbatch"
    argv = ["render", "-i", str(slurm_inventory), "--slurm", "-o", str(target), "--json"]
    assert run([*argv, str(PLAYBOOK)]) == 0
    doc = json.loads(capsys.readouterr().out)  # one document, nothing else on stdout
    assert doc["kind"] == "sbatch" and doc["path"] == str(target)
    assert doc["next"].startswith(f"sbatch {target}")
    assert target.read_text().startswith("#!")


def test_render_json_to_stdout_carries_the_text(
    slurm_inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["render", "-i", str(slurm_inventory), "--slurm", "--json", str(PLAYBOOK)]
    assert run(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] is None and doc["text"].startswith("#!")
    # without --json the same command prints the script itself, not JSON
    assert run([*argv[:-2], str(PLAYBOOK)]) == 0
    assert capsys.readouterr().out == doc["text"]


def test_tunnel_document(tmp_path: Path) -> None:
    token = tmp_path / "auth_token"
    exports = ray_env_lines("http://127.0.0.1:41234", token)
    doc = tunnel_doc("http://127.0.0.1:41234", "http://127.0.0.1:41235", token, exports, 29009)
    assert doc["dashboard"] == {"url": "http://127.0.0.1:41234", "port": 41234}
    assert doc["tensorboard"] == {
        "url": "http://127.0.0.1:41235",
        "port": 41235,
        "head_port": 29009,
    }
    assert doc["token_path"] == str(token.resolve())
    assert doc["exports"][0] == "export RAY_ADDRESS=http://127.0.0.1:41234"
    json.dumps(doc)  # a JSON document as it stands
    served = Board("started", 29009, pid=42, logdir="/provisioner/results")
    with_board = tunnel_doc(
        "http://127.0.0.1:41234", "http://127.0.0.1:41235", token, exports, 29009, served
    )
    assert with_board["tensorboard"] == {
        "url": "http://127.0.0.1:41235",
        "port": 41235,
        "head_port": 29009,
        "serving": True,
        "state": "started",
        "logdir": "/provisioner/results",
        "error": None,
        "fix": None,
    }
    json.dumps(with_board)
