"""Options and state shared by every command group."""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
import traceback
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


def quiet_background() -> None:
    """At the CLI's entry: nothing but the tool's own lines on stderr from the threads behind
    a command. paramiko's records (its transport thread's errors, tracebacks included: a
    hung sshd's banner that never came) stop at its logger, even where an imported library
    configured the root logger; the user gets their cause in the tool's own error. An
    exception that ends a thread unhandled (none should) is one line naming a file with its
    traceback, as one in the command itself is."""
    log = logging.getLogger("paramiko")
    log.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    if threading.excepthook is threading.__excepthook__:  # a test runner's own hook stays
        threading.excepthook = _thread_crashed


def _thread_crashed(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    handle, name = tempfile.mkstemp(prefix="provisioner-crash-", suffix=".txt")
    with open(handle, "w") as f:
        f.write("".join(traceback.format_exception(args.exc_value)))
    where = args.thread.name if args.thread is not None else "a background thread"
    print(
        f"error: unexpected {args.exc_type.__name__} in {where}: {args.exc_value}",
        file=sys.stderr,
    )
    print(f"the full traceback is in {name}; please report it", file=sys.stderr)


ResultsOption = Annotated[
    Path, typer.Option("--results", help="Where results/JOB/ directories are made.")
]
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
