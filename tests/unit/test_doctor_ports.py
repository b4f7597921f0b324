"""The port matrix: who listens where, who probes whom, and who is blamed."""

from __future__ import annotations

import signal
import subprocess
import sys
from importlib import resources

import pytest

from provisioner.checks.ports import (
    judge_probes,
    listen_ports,
    needed_ports,
    parse_probe_output,
    probe_plan,
)
from provisioner.doctor.gather import (
    LISTENER_MARK,
    RUN_MARK,
    new_nonce,
    stop_listener_command,
    stop_run_listeners_command,
)
from provisioner.inventory import Node, RayPorts, SSHSettings

SSH = SSHSettings(user="u")
HEAD = Node("h", "10.0.0.1", "head", SSH)
W1 = Node("w1", "10.0.0.2", "worker", SSH)
W2 = Node("w2", "10.0.0.3", "worker", SSH)
NODES = [HEAD, W1, W2]
PORTS = RayPorts()


def bound() -> dict[str, tuple[int, ...]]:
    return {n.name: tuple(listen_ports(n, PORTS)) for n in NODES}


def test_head_needs_gcs_dashboard_client_workers_do_not() -> None:
    assert {"gcs", "dashboard", "client"} <= set(needed_ports(HEAD, PORTS))
    assert not {"gcs", "dashboard", "client"} & set(needed_ports(W1, PORTS))
    assert PORTS.gcs in listen_ports(HEAD, PORTS) and PORTS.gcs not in listen_ports(W1, PORTS)


def test_plan_workers_probe_head_gcs_and_each_other() -> None:
    plan = probe_plan(NODES, PORTS, bound())
    w1 = {(p.target, p.purpose) for p in plan["w1"]}
    assert ("h", "gcs") in w1 and ("w2", "object_manager") in w1 and ("w2", "min_worker") in w1
    assert ("w2", "dashboard_agent_grpc") not in w1
    assert ("w1", "dashboard_agent_grpc") in {(p.target, p.purpose) for p in plan["h"]}
    assert not [p for p in plan["h"] if p.purpose == "gcs"]


def test_plan_skips_nodes_without_listener() -> None:
    partial = {k: v for k, v in bound().items() if k != "w2"}
    plan = probe_plan(NODES, PORTS, partial)
    assert plan["w2"] == [] and all(p.target != "w2" for ps in plan.values() for p in ps)


def outcomes_with(blocked: set[tuple[str, str]], how: str = "timeout") -> dict:  # type: ignore[type-arg]
    plan = probe_plan(NODES, PORTS, bound())
    result = {}
    for source, probes in plan.items():
        text = "\n".join(
            f"{p.address} {p.port} {how if (source, p.target) in blocked else 'ok'}" for p in probes
        )
        result.update(parse_probe_output(source, probes, text))
    return result


def test_all_ok_no_findings() -> None:
    assert judge_probes(outcomes_with(set()), {}) == []


def test_cut_pair_blames_both_ends_not_the_head() -> None:
    findings = judge_probes(outcomes_with({("w1", "w2"), ("w2", "w1")}), {"w2": "10.0.0.3"})
    assert sorted(f.host for f in findings) == ["w1", "w2"]
    assert all(f.severity == "error" and f.check == "net.reachability" for f in findings)
    assert "dropped" in findings[0].message


def test_firewalled_target_is_blamed_itself() -> None:
    findings = judge_probes(outcomes_with({("w1", "h"), ("w2", "h")}, "refused"), {})
    assert [f.host for f in findings] == ["h"]
    assert "no other node reaches h" in findings[0].message


def test_missing_probe_lines_count_as_untested() -> None:
    plan = probe_plan(NODES, PORTS, bound())
    outcome = parse_probe_output("w1", plan["w1"], "")
    assert set(outcome.values()) == {"missing"}


def test_stop_listener_command_kills_only_the_marked_process() -> None:
    """Run here by bash against real processes: the marked one ends; an unmarked one with
    another PID (a PID the node has reused) survives; the command exits 0 either way."""
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", LISTENER_MARK])
    other = subprocess.Popen(["sleep", "60"])
    try:
        for proc in (other, marked):
            done = subprocess.run(["bash", "-c", stop_listener_command(proc.pid)], check=False)
            assert done.returncode == 0
        assert marked.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None  # still running
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()
    # the facts script starts the listener with the mark as its last word
    text = resources.files("provisioner.doctor").joinpath("facts.sh").read_text()
    assert f'"$listen_seconds" "{RUN_MARK}$run_nonce" \\\n  {LISTENER_MARK}\n' in text


def test_an_interrupted_runs_stop_ends_its_own_listeners_and_no_other() -> None:
    """Run here by bash against real processes: the listener carrying this run's nonce
    ends (whatever its PID: the run may not have read it); another run's listener, and a
    process carrying the nonce but no listener mark, run on; the command exits 0."""

    def started(*words: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *words])

    nonce, other_nonce = new_nonce(), new_nonce()
    ours = started(RUN_MARK + nonce, LISTENER_MARK)
    theirs = started(RUN_MARK + other_nonce, LISTENER_MARK)
    unmarked = started(RUN_MARK + nonce)
    try:
        done = subprocess.run(["bash", "-c", stop_run_listeners_command(nonce)], check=False)
        assert done.returncode == 0
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert theirs.poll() is None and unmarked.poll() is None  # still running
    finally:
        for proc in (ours, theirs, unmarked):
            proc.kill()
            proc.wait()
    with pytest.raises(ValueError):
        stop_run_listeners_command("x; reboot")
