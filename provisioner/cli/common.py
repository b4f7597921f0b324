"""Options and state shared by every command group."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from provisioner.console import Output


@dataclass
class _State:
    output: Output | None = None


state = _State()


def output(json_mode: bool) -> Output:
    """Create the command's Output and remember it for error reporting."""
    state.output = Output(json_mode=json_mode)
    return state.output


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
InventoryOption = Annotated[
    Path,
    typer.Option(
        "-i",
        "--inventory",
        help="Inventory file (provisioner YAML, Ansible INI/YAML).",
        envvar="PROVISIONER_INVENTORY",
    ),
]
