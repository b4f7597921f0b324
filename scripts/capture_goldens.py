"""Capture the doctor's golden facts (tests/unit/golden/doctor/) from a real lab.

    make goldens                                  # a 3-node lab named `golden`, then removed
    .venv/bin/python scripts/capture_goldens.py --lab NAME --subnet 10.250.N.0/24 [--keep]

Each golden file is facts.sh's raw output, run on a lab node over SSH exactly as the doctor
runs it (`bash -s -- HEAD NODE IMAGE '' 0`: no listener), with at most one lab fault
injected (provisioner/lab/faults.py, mended right after). `nodes.json` records the lab's
node names and addresses, which the unit tests judge the facts against.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from provisioner.doctor.gather import facts_script
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabConfig, LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo, lab_down, lab_up
from provisioner.remote import Pool
from provisioner.remote.commands import script
from provisioner.runtime import judges

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "unit" / "golden" / "doctor"
IMAGE_TAG = "provisioner-golden/empty:1"


def with_env(env: Mapping[str, str], cmd: str) -> str:
    """`cmd` with environment variables set (names checked, values quoted)."""
    for name in env:
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(f"not an environment variable name: {name!r}")
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return f"env {assignments} {cmd}" if assignments else cmd


def facts_text(
    lab: LabInfo, node: LabNode, image: str = "", env: dict[str, str] | None = None
) -> str:
    """facts.sh's stdout on `node`, as the doctor's first round gets it."""
    inventory = load_inventory(lab.inventory)
    target = next(n for n in inventory.nodes if n.name == node.name)
    text = facts_script(judges(inventory.runtime))  # facts.sh with the runtime's section
    cmd = script("bash", [inventory.head.address, target.address, image, "", 0])
    with Pool(inventory) as pool:
        result = pool.session(target).run(with_env(env or {}, cmd), timeout=60, stdin=text)
    if result.exit_code != 0 or "@@end" not in result.stdout:
        raise SystemExit(f"{node.name}: facts.sh failed (exit {result.exit_code}): {result.stderr}")
    return result.stdout


def with_breakage(lab: LabInfo, node: LabNode, name: str, take: Callable[[], str]) -> str:
    faults.break_node(lab, node, name)
    try:
        return take()
    finally:
        faults.mend(lab, node, name)


def capture(lab: LabInfo) -> dict[str, str]:
    head, w1, w2 = lab.nodes[:3]
    out: dict[str, str] = {}
    out["healthy_head"] = facts_text(lab, head)
    out["healthy_worker"] = facts_text(lab, w1)
    faults.occupy(lab, head, 6379)
    try:
        out["port_6379_busy"] = facts_text(lab, head)
    finally:
        faults.release(lab, head, 6379)
    out["stale_raylet"] = with_breakage(lab, head, "stale-raylet", lambda: facts_text(lab, head))
    out["docker_needs_sudo"] = with_breakage(lab, w1, "docker-group", lambda: facts_text(lab, w1))
    out["ray_login_only"] = with_breakage(lab, w1, "ray-login-only", lambda: facts_text(lab, w1))
    out["python_3_10"] = with_breakage(lab, w2, "python-3.10", lambda: facts_text(lab, w2))
    out["hostname_loopback"] = with_breakage(
        lab, w2, "hostname-loopback", lambda: facts_text(lab, w2)
    )
    # A SIMULATED GPU node (provisioner/lab/gpusim.py): stand-ins in NVIDIA's formats
    for name in ("gpu", "gpu-no-toolkit", "gpu-no-driver"):
        header = (
            f"facts.sh on a lab node with the lab fault `{name}`: a SIMULATED GPU node "
            "(provisioner/lab/gpusim.py). Its nvidia-smi is a stand-in answering in the format "
            "of NVIDIA's nvidia-smi man page (--query-gpu, --format=csv,noheader,nounits); "
            "its Docker runtime `nvidia` runs runc. Not a real GPU.\n"
        )
        out[f"simulated_{name.replace('-', '_')}"] = header + with_breakage(
            lab, w1, name, lambda: facts_text(lab, w1)
        )
    # One node, one moment, both ways facts.sh reads Docker: over the socket from python3,
    # and through the docker CLI (its fallback, here forced by DOCKER_HOST).
    rc, said = exec_rc(
        head.container, f"tar cf - --files-from /dev/null | docker import - {IMAGE_TAG}"
    )
    if rc != 0:
        raise SystemExit(f"{head.name}: cannot make an image to inspect: {said}")
    image = said.strip().splitlines()[-1]
    try:
        out["pair_lean_format"] = facts_text(lab, head, image)
        out["pair_cli_format"] = facts_text(
            lab, head, image, {"DOCKER_HOST": "unix:///var/run/docker.sock"}
        )
    finally:
        exec_rc(head.container, f"docker image rm {IMAGE_TAG}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="golden", help="lab name (default: golden)")
    parser.add_argument("--subnet", default="10.250.1.0/24", help="the lab's subnet")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    parser.add_argument("--out", type=Path, default=GOLDEN, help="where the files go")
    args = parser.parse_args(argv)
    cfg = LabConfig(name=args.lab, subnet=args.subnet, nodes=3)
    lab = lab_up(cfg, lambda line: print(line, file=sys.stderr))
    try:
        faults.clear(lab)
        files = capture(lab)
    finally:
        if not args.keep:
            lab_down(cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / f"{name}.txt").write_text(text)
    nodes = {"head": lab.nodes[0].name, "nodes": [n.to_json() for n in lab.nodes]}
    (args.out / "nodes.json").write_text(json.dumps(nodes, indent=1) + "\n")
    print(f"{len(files)} golden files and nodes.json written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
