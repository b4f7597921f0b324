"""docs/reference.md, made from the CLI itself: every command with its arguments and
options (from the click tree typer builds), and every environment variable the code reads.

    python scripts/reference.py --write   # make docs/reference.md
    python scripts/reference.py --check   # exit 1, naming what differs, when it is stale

`make test` runs the check (tests/unit/test_reference.py), so a flag added to the CLI and
not to the manual fails the suite.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any

import typer.main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provisioner.cli import app  # noqa: E402

TARGET = ROOT / "docs" / "reference.md"

# Every PROVISIONER_* variable the code names: what it does, for whom. The check fails
# when the code names one that is missing here, or this names one the code no longer has.
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "PROVISIONER_INVENTORY": ("you", "the inventory file, when `-i` is not given"),
    "PROVISIONER_STATE_DIR": (
        "you",
        "where clusters' state lives on this machine (tokens, CA, jobs, logs); "
        "default `$XDG_STATE_HOME/provisioner`, else `~/.local/state/provisioner`",
    ),
    "PROVISIONER_SSH_CONFIG": (
        "you",
        "an ssh_config file read instead of `~/.ssh/config`; one that does not exist is an "
        "error (tests point it at a hidden home's)",
    ),
    "PROVISIONER_PULL_MAX_BYTES": (
        "you",
        "the most bytes one bringing-home of results may fetch (default 64 GiB); "
        "a file over it is refused by name",
    ),
    "PROVISIONER_IMAGES_DIR": ("you", "the image recipe folder (`--images-dir`)"),
    "PROVISIONER_WHEELHOUSE": ("you", "the wheel folder the image is built from (`--wheelhouse`)"),
    "PROVISIONER_IMAGE_LOCK": ("you", "the image pin `lab up` writes into the lab's inventory"),
    "PROVISIONER_BASE_IMAGE": (
        "you",
        "a base image you have (pulled or local) for the lab's node images, "
        "instead of the debootstrap base",
    ),
    "PROVISIONER_DEBIAN_MIRROR": (
        "you",
        "the Debian mirror debootstrap and the lab's images use (default: the machine's own)",
    ),
    "PROVISIONER_LAB_NAME": ("you", "the lab's name (default `lab`)"),
    "PROVISIONER_LAB_SUBNET": ("you", "the lab's network (default `10.250.0.0/24`)"),
    "PROVISIONER_RESULTS_DIR": ("your playbook", "the folder the job writes its results to"),
    "PROVISIONER_RESULTS_ROOT": ("your playbook", "the node's folder of every job's results"),
    "PROVISIONER_RESUME_FROM": ("your playbook", "the checkpoint to resume from (`--resume`)"),
    "PROVISIONER_TUNE_RESUME": (
        "your script",
        "the earlier Tune experiment its first `Tuner(...)` restores (`--resume`, `--retries`)",
    ),
    "PROVISIONER_TRIALS": (
        "the job's watcher",
        "how many trials an experiment file's sweep makes (its progress: those pending)",
    ),
    "PROVISIONER_METRIC": (
        "the job's watcher",
        "what a sweep's best trial is judged by (the file's `metric`)",
    ),
    "PROVISIONER_MODE": ("the job's watcher", "`max` or `min` (the file's `mode`)"),
    "PROVISIONER_RETRIES": ("your playbook", "how many retries `submit --retries` allows"),
    "PROVISIONER_PRICE_PER_NODE_HOUR": (
        "your playbook",
        "the price of a node-hour (`submit --price-per-hour`, or the inventory's): the run's "
        "cost in summary.json",
    ),
    "PROVISIONER_CLUSTER_ID": (
        "your playbook",
        "this cluster's id, in every Ray process's environment (host mode tells its own "
        "processes from other users' by it)",
    ),
    "PROVISIONER_CHECKPOINT_ON_SIGTERM": (
        "your playbook",
        "set by the SageMaker entry point: SIGTERM ends the run after its iteration with a "
        "checkpoint",
    ),
    "PROVISIONER_SM_CHECKPOINT_DIR": (
        "the SageMaker image",
        "where checkpoints and results go (default `/opt/ml/checkpoints`; local mode: the "
        "`checkpoints` channel)",
    ),
    "PROVISIONER_SM_JOIN_TIMEOUT_S": (
        "the SageMaker image",
        "how long the head waits for every host to join, and a worker for the head (300)",
    ),
    "PROVISIONER_SM_NUM_CPUS": ("the SageMaker image", "`ray start --num-cpus` on each host"),
    "PROVISIONER_SM_NUM_GPUS": ("the SageMaker image", "`ray start --num-gpus` on each host"),
    "PROVISIONER_SM_OBJECT_STORE_BYTES": (
        "the SageMaker image",
        "`ray start --object-store-memory` on each host (local mode: 256 MiB)",
    ),
}
# Names in the code that are not environment variables a person sets or reads.
NOT_ENVIRONMENT = {
    "PROVISIONER_MEMO": "the doctor's facts script's memo of interpreter answers, inside one run",
    "PROVISIONER_PROBE": "the marker line of the cluster probe's output",
    "PROVISIONER_BOARD": "the marker line of the head's TensorBoard script (`tunnel`)",
    "PROVISIONER_VARS": "a Python constant: the inventory variables Ansible's format may carry",
}
_NAME = re.compile(r"\bPROVISIONER_[A-Z0-9_]+\b")


def names_in_code() -> set[str]:
    found: set[str] = set()
    for folder in ("provisioner", "playbooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".sh"} and path.is_file():
                found |= set(_NAME.findall(path.read_text()))
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _params(cmd: Any) -> list[str]:
    """One row per argument and option, as `--help` shows it: typer builds a click tree
    (its own copy of click, in recent releases), read here by its help records."""
    ctx = cmd.context_class(cmd)
    rows = []
    for param in cmd.params:
        if getattr(param, "hidden", False) or param.name in {"help"}:
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        rows.append(f"| `{names}` | {_cell(help_text)} |")
    if not rows:
        return []
    return ["| argument / option | what |", "|---|---|", *rows, ""]


def _walk(cmd: Any, path: list[str], out: list[str], toc: list[str]) -> None:
    name = " ".join(path)
    if hasattr(cmd, "commands"):
        for sub_name in sorted(cmd.commands):
            sub = cmd.commands[sub_name]
            if not sub.hidden:
                _walk(sub, [*path, sub_name], out, toc)
        return
    anchor = name.replace(" ", "-")
    toc.append(f"- [`{name}`](#{anchor})")
    out.append(f'<a id="{anchor}"></a>')
    out.append(f"### `{name}`")
    out.append("")
    summary = (cmd.help or "").strip().split("\n\n")[0]
    if summary:
        out += [_cell(summary), ""]
    usage = " ".join(cmd.collect_usage_pieces(cmd.context_class(cmd)))
    out += [f"`{name} {usage}`", ""]
    out += _params(cmd)


def render() -> str:
    root = typer.main.get_command(app)
    out: list[str] = []
    toc: list[str] = []
    _walk(root, ["provisioner"], out, toc)
    head = [
        "# Reference",
        "",
        "Every command, option and environment variable, made from the CLI itself by",
        "`python scripts/reference.py --write`; `make test` fails when this file and the CLI",
        "differ. Every command that reports takes `--json` (one JSON document on stdout).",
        "Bad input exits 2 with what, where and the fix; a failed operation exits 1.",
        "",
        "## Commands",
        "",
        *toc,
        "",
    ]
    env = ["## Environment", "", "| variable | for | what |", "|---|---|---|"]
    for var in sorted(ENVIRONMENT):
        who, what = ENVIRONMENT[var]
        env.append(f"| `{var}` | {who} | {_cell(what)} |")
    return "\n".join([*head, *out, *env]) + "\n"


def problems() -> list[str]:
    """What is wrong: environment names undocumented or stale, the file out of date."""
    found = names_in_code() - set(NOT_ENVIRONMENT)
    out = [f"{v}: named in the code, not in ENVIRONMENT" for v in sorted(found - set(ENVIRONMENT))]
    out += [f"{v}: in ENVIRONMENT, no longer in the code" for v in sorted(set(ENVIRONMENT) - found)]
    want = render()
    have = TARGET.read_text() if TARGET.is_file() else ""
    if want != have:
        diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "committed", "CLI", n=0)
        out.append("docs/reference.md differs from the CLI:\n" + "\n".join(list(diff)[:40]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    a = p.parse_args()
    if a.write:
        TARGET.write_text(render())
        print(f"{TARGET.relative_to(ROOT)}: written")
        return 0
    found = problems()
    for line in found:
        print(line)
    if found:
        print("fix: describe new variables in scripts/reference.py, then make reference")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
