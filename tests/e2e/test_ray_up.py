"""The proof that `provisioner render` writes a file Ray's own launcher accepts.

A plain `ray up -y cluster.yaml` (the host venv's `ray`, a fresh HOME, no extra
variables) brings every lab node into `ray status`, its GCS speaking TLS with the
cluster's CA (a client without its certificate refused); `ray down -y` removes every Ray
container; a second `ray up` after that `ray down` works too (no "Adding 1 node(s)" loop).

Ray 2.60's local provider keeps its launcher-side state in /tmp/ray/cluster-NAME.state on
the machine that runs `ray` (not under HOME). Its first `ray down` marks the workers
"teardown_complete" there and nothing clears it, so every later `ray down` from that machine
skips the workers. A new user's machine has no such file: the test starts without it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container
from tests.e2e.helpers import ssh
from tests.e2e.test_cluster_lifecycle import cli, cli_json, inventory  # noqa: F401
from tests.e2e.test_tls import assert_gcs_tls, check_gcs

RAY = str(Path(sys.executable).parent / "ray")
LOOP = "Adding 1 node(s) of type local.cluster.node"
# what the head's autoscaler said of the workers' updates (not its periodic status table)
STATUS_TABLE = (
    r"^( |-|=|$|Node status|Active:|Pending:|Recent failures:|Resources|Total Usage:"
    r"|From request_resources:|Pending Demands:)"
)
MONITOR_TAIL = (
    "sh -c 'cd /tmp/ray/session_latest/logs && "
    f'grep -hvE "{STATUS_TABLE}" monitor.log monitor.out monitor.err 2>&1 | '
    'grep -v "took .* seconds" | tail -n 80\''
)


def plain_ray(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ray ARGS` as a new user would run it: a fresh HOME, a plain PATH, nothing else."""
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    return subprocess.run(
        [RAY, *args], env=env, cwd=home, capture_output=True, text=True, timeout=timeout
    )


def active_nodes(lab: LabInfo, container: str) -> int:
    """Active nodes in `ray status`, run inside the head container (token from its env)."""
    text = ssh(lab, lab.nodes[0], f"docker exec {container} ray status 2>&1").stdout
    block = text.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in text else ""
    return sum(int(m) for m in re.findall(r"^\s*(\d+) \S+", block, flags=re.M))


def wait_active(lab: LabInfo, container: str, expected: int, limit: float = 180) -> int:
    """Active nodes once `expected` are, or at `limit`: the workers are started by the
    head's autoscaler after `ray up` returns, one update each, slow on a loaded machine."""
    deadline = time.monotonic() + limit
    seen = 0
    while time.monotonic() < deadline:
        seen = active_nodes(lab, container)
        if seen >= expected:
            return seen
        time.sleep(2)
    return seen


def launcher_state(cluster: str) -> Path:
    from ray.autoscaler._private.local.config import get_state_path

    return Path(get_state_path(cluster))


def test_plain_ray_up_down_up(inventory: str, lab: LabInfo, tmp_path: Path) -> None:  # noqa: F811
    inv = load_inventory(Path(inventory))
    container = ray_container(inv)
    assert cli("down", "-i", inventory, "--no-logs")[0] == 0
    launcher_state(inv.cluster).unlink(missing_ok=True)
    home = tmp_path / "home"
    home.mkdir()
    config = home / "cluster.yaml"
    assert cli("render", "-i", inventory, "-o", str(config))[0] == 0
    try:
        for attempt in (1, 2):
            up = plain_ray(home, "up", "-y", str(config))
            assert up.returncode == 0, f"ray up #{attempt}:\n{up.stdout[-3000:]}{up.stderr[-3000:]}"
            started = time.monotonic()
            seen = wait_active(lab, container, len(inv.nodes))
            print(f"ray up #{attempt}: {seen} active after {time.monotonic() - started:.0f}s")
            if seen != len(inv.nodes):
                monitor = ssh(lab, lab.nodes[0], f"docker exec {container} {MONITOR_TAIL}")
                pytest.fail(f"ray up #{attempt}: {seen} active in `ray status`\n{monitor.stdout}")
            code, st = cli_json("status", "-i", inventory)
            assert code == 0 and st["alive_nodes"] == 3, st  # every inventory address alive
            if attempt == 1:  # Ray under TLS with the cluster's CA, as `up` runs it
                (tmp_path / "tls").mkdir()
                assert_gcs_tls(inv, check_gcs(inv, tmp_path / "tls"))
            monitor = ssh(
                lab,
                lab.nodes[0],
                f"docker exec {container} sh -c 'cat /tmp/ray/session_latest/logs/monitor.log'",
            ).stdout
            assert monitor.count(LOOP) < 3, f"the launcher loops: {LOOP}"
            if attempt == 2:
                break
            down = plain_ray(home, "down", "-y", str(config))
            assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
            for node in lab.nodes:
                left = ssh(lab, node, f"docker ps -aq --filter name=^{container}$").stdout
                assert left.strip() == "", f"{node.name} still has {container} after ray down"
    finally:
        # `provisioner down` removes what `ray up` started (same container name), workers too.
        plain_ray(home, "down", "-y", str(config))
        assert cli("down", "-i", inventory, "--no-logs")[0] == 0
        launcher_state(inv.cluster).unlink(missing_ok=True)
        # the launcher's copies of its file mounts (the head's: the SSH key it was given)
        for node in lab.nodes:
            ssh(lab, node, f"sudo rm -rf /tmp/ray_tmp_mount/{inv.cluster}")
