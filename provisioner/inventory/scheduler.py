"""`scheduler: {type: slurm, ...}`: the nodes come from a SLURM allocation, not a list.

One table of fields (SCHEDULER_FIELDS), each value checked here with its line and a fix;
what reaches an sbatch command line or an `#SBATCH` line is checked against strict
patterns first (and quoted by the builders anyway).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.inventory.fields import Where, check_keys
from provisioner.inventory.located import LocatedList, LocatedMap
from provisioner.inventory.models import Slurm, time_seconds
from provisioner.inventory.raw import RawHost

SCHEDULER_FIELDS = {
    "type": "the scheduler: slurm",
    "login": "the login node that runs sbatch/squeue/scancel: an address or {name, address, ...}",
    "partition": "SLURM partition (default: the cluster's default partition)",
    "nodes": "how many nodes to allocate (default 1)",
    "time": "time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    "cpus_per_node": "CPUs on each node for Ray (sbatch --cpus-per-task; default: SLURM's)",
    "gpus_per_node": "GPUs on each node (sbatch --gpus-per-node)",
    "account": "account to charge (sbatch --account)",
    "extra_sbatch_args": "more sbatch options, a list such as [--qos=debug, --constraint=ib]",
}
SCHEDULER_TYPES = ("slurm",)
# Matched whole (fullmatch: `$` would let a trailing newline through).
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
_SBATCH_ARG = re.compile(r"--[a-z][a-z0-9-]*(?:=[A-Za-z0-9_.,:=+/@%-]*)?")
# What provisioner sets itself: the job's name and comment tell its job from any other
# (`up` reuses and `down` cancels only that one), so an extra argument may not change them.
_OWN_SBATCH_ARGS = ("--job-name", "--comment")


@dataclass
class RawScheduler:
    login: RawHost
    slurm: Slurm


def _line(mapping: Any, key: str, fallback: Where) -> Where:
    return fallback.at(mapping.line_of(key)) if isinstance(mapping, LocatedMap) else fallback


def _count(value: Any, where: Where, field: str, *, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise where.error(
            field, f"expected a whole number, {least} or more, got {value!r}", "use e.g. 2"
        )
    return value


def _word(value: Any, where: Where, field: str) -> str:
    if not isinstance(value, str | int) or not _WORD.fullmatch(str(value)):
        raise where.error(
            field,
            f"expected a SLURM name (letters, digits, '_', '.', '+', '-'), got {value!r}",
            "write the name as `sinfo` / `sacctmgr show assoc` print it",
        )
    return str(value)


def _time(value: Any, where: Where, field: str) -> str:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    try:
        if time_seconds(text) <= 0:
            raise ValueError(text)
    except ValueError:
        raise where.error(
            field,
            f"expected a SLURM time limit, got {value!r}",
            "quote it and use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
            '(e.g. time: "02:00:00")',
        ) from None
    return text


def _extra(value: Any, where: Where, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise where.error(field, f"expected a list, got {value!r}", "write [--qos=debug, ...]")
    lines = value.item_lines if isinstance(value, LocatedList) else [where.line] * len(value)
    for i, (item, line) in enumerate(zip(value, lines, strict=True)):
        if not isinstance(item, str) or not _SBATCH_ARG.fullmatch(item):
            raise where.at(line).error(
                f"{field}[{i}]",
                f"expected one long sbatch option as --name or --name=value, got {item!r}",
                "write each option whole, e.g. --qos=debug (no spaces, no short options)",
            )
        if item.split("=", 1)[0] in _OWN_SBATCH_ARGS:
            raise where.at(line).error(
                f"{field}[{i}]",
                f"{item.split('=', 1)[0]} is set by provisioner (the job's name and comment "
                "are how it knows its own job)",
                "remove it; the job is named after the cluster (`provisioner-CLUSTER`)",
            )
    return tuple(value)


def parse_scheduler(value: Any, where: Where, path: Path, parse_host: Any) -> RawScheduler:
    """The `scheduler:` section; `parse_host` reads the login node like any node."""
    if not isinstance(value, dict):
        raise where.error(
            "scheduler", f"expected a mapping, got {value!r}", "write scheduler: {type: slurm, ...}"
        )
    check_keys(value, SCHEDULER_FIELDS, where, "scheduler.")

    def at(key: str) -> Where:
        return _line(value, key, where)

    kind = value.get("type")
    if kind not in SCHEDULER_TYPES:
        raise at("type").error(
            "scheduler.type",
            f"expected {' | '.join(SCHEDULER_TYPES)}, got {kind!r}",
            "write type: slurm",
        )
    if value.get("login") is None:
        raise where.error(
            "scheduler.login",
            "missing",
            "add login: ADDRESS (the machine where you run sbatch and squeue)",
        )
    login = parse_host(value["login"], at("login"), path, "scheduler.login")
    slurm = Slurm(
        partition=None
        if value.get("partition") is None
        else _word(value["partition"], at("partition"), "scheduler.partition"),
        nodes=_count(value.get("nodes", 1), at("nodes"), "scheduler.nodes", least=1),
        time=None
        if value.get("time") is None
        else _time(value["time"], at("time"), "scheduler.time"),
        cpus_per_node=None
        if value.get("cpus_per_node") is None
        else _count(
            value["cpus_per_node"], at("cpus_per_node"), "scheduler.cpus_per_node", least=1
        ),
        gpus_per_node=None
        if value.get("gpus_per_node") is None
        else _count(
            value["gpus_per_node"], at("gpus_per_node"), "scheduler.gpus_per_node", least=0
        ),
        account=None
        if value.get("account") is None
        else _word(value["account"], at("account"), "scheduler.account"),
        extra_sbatch_args=_extra(
            value.get("extra_sbatch_args"), at("extra_sbatch_args"), "scheduler.extra_sbatch_args"
        ),
    )
    return RawScheduler(login=login, slurm=slurm)
