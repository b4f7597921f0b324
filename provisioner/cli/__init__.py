"""The command line: parse, call the library, render, map errors to exit codes.

Exit codes: 0 ok, 1 the operation failed or the cluster is unhealthy,
2 bad input (usage, inventory, configuration), 130 interrupted.
"""

# ruff: noqa: E402 (invoke is kept out before the imports that bring paramiko)
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# paramiko imports invoke (and with it unittest.mock: 75 ms of every command's
# start) only to run ssh_config's `Match exec`, which provisioner reads with OpenSSH's own
# `ssh -G` (its paramiko fallback refuses Match). A None entry makes that optional import
# fail at once, as paramiko allows; a process that already imported invoke keeps it.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]

import typer
import typer.main
from rich.markup import escape
from typer.exceptions import TyperException

from provisioner.cli import common
from provisioner.cli import lab as lab_cli
from provisioner.cli.common import quiet_background, state
from provisioner.errors import ProvisionerError

# The command groups (modules of this package), in the order `--help` lists them, and the
# commands each registers: `provisioner CMD ...` imports only CMD's group, not every
# group's library (a command's start was a fifth of a second longer).
GROUPS: dict[str, tuple[str, ...]] = {
    "doctor": ("doctor",),
    "image": ("image",),
    "cluster": ("render", "up", "status", "down", "logs", "tunnel"),
    "jobs": ("submit",),
    "jobs_group": ("jobs",),
    "sagemaker": ("sagemaker",),
    "analysis": ("compare", "eval"),
}


def build_app(groups: Sequence[str] = tuple(GROUPS)) -> typer.Typer:
    """The command line with the lab's commands and those of `groups`."""
    built = typer.Typer(
        name="provisioner",
        help="From an inventory of machines you own to a verified Ray cluster for RLlib training.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    built.add_typer(lab_cli.app, name="lab")
    for name in groups:
        importlib.import_module(f"provisioner.cli.{name}").register(built)
    return built


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The command line `argv` needs: its command's group only (every group for --help,
    no command, or a word that is no command)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    group = next((g for g, commands in GROUPS.items() if first in commands), None)
    return build_app((group,)) if group is not None else whole_app()


@functools.cache
def whole_app() -> typer.Typer:
    """Every command (one object: scripts/reference.py renders it, tests extend it)."""
    return build_app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `provisioner.cli.app`: the whole command line
        return whole_app()
    raise AttributeError(name)


def prose(text: str) -> str:
    """Help text as a reader takes it: a docstring's line breaks are the source's, not the
    text's, so each paragraph's lines are joined (`--help` wraps them to the terminal), the
    paragraphs kept; and what looks like rich markup is shown as written
    (`s3://BUCKET[/PREFIX]`), never read as a style."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    joined = (" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs)
    return "\n\n".join(escape(p) for p in joined if p)


def command_for(app: typer.Typer) -> Any:
    """The click command tree typer makes of `app`, every help text in it (commands',
    arguments' and options') made `prose`: what `--help` shows."""
    root = typer.main.get_command(app)
    todo = [root]
    while todo:
        command = todo.pop()
        if command.help:
            command.help = prose(command.help)
        for param in command.params:
            text = getattr(param, "help", None)
            if text:
                setattr(param, "help", prose(text))  # noqa: B010 (click.Parameter has no help)
        todo.extend(getattr(command, "commands", {}).values())
    return root


def json_wanted(args: Sequence[str]) -> bool:
    """`--json` among the command's own words (not a playbook's, after `--`)."""
    words = list(args)
    return "--json" in (words[: words.index("--")] if "--" in words else words)


def usage_json(exc: TyperException) -> dict[str, Any]:
    """A usage error (unknown command or option, a value out of range) as `--json` carries
    every error: what, where (the option or the command), the fix (its `--help`)."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "provisioner"
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None) or ([param.name] if param is not None else [])
    where = " / ".join(opts) or getattr(exc, "option_name", None) or command
    return {
        "kind": type(exc).__name__,
        "message": exc.format_message(),
        "where": where,
        "fix": f"see `{command} --help`",
        "exit_code": 2,
    }


def _report_bug(exc: BaseException) -> Path:
    handle, name = tempfile.mkstemp(prefix="provisioner-crash-", suffix=".txt")
    with open(handle, "w") as f:
        f.write("".join(traceback.format_exception(exc)))
    return Path(name)


def _interrupted(json_mode: bool = False) -> None:
    """Ctrl-C: say so, and where each node of the command stood (its last step); under
    --json the error document, also when the command had not made its output yet."""
    out = state.output or (common.output(json_mode) if json_mode else None)
    states = out.node_states() if out else []
    print("interrupted" + (": where each node stood" if states else ""), file=sys.stderr)
    for line in states:
        print(f"  {line}", file=sys.stderr)
    if states:
        print("run the same command again: it picks up from each node's state", file=sys.stderr)
    if out is not None:
        out.emit_error(
            {"kind": "interrupted", "message": "interrupted", "exit_code": 130, "nodes": states}
        )


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `provisioner` console script; exits with the contract's codes."""
    sys.exit(run(argv))


def run(argv: list[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (tests call this)."""
    state.output = None  # set by the command once it parsed its options
    quiet_background()
    args = sys.argv[1:] if argv is None else argv
    json_mode = json_wanted(args)
    try:
        command = command_for(app_for(args))
        result = command.main(args=args, prog_name="provisioner", standalone_mode=False)
        if result == 130:  # typer turns Ctrl-C into a silent Exit(130)
            _interrupted(json_mode)
        return result if isinstance(result, int) else 0
    except ProvisionerError as exc:
        # an error before the command made its Output (an option checked first) has one too
        out = state.output or common.output(json_mode)
        line = f"[bold red]error:[/bold red] {escape(str(exc))}"
        out.err.print(line, markup=True, highlight=False)
        if exc.fix:
            out.err.print(f"[bold]fix:[/bold] {escape(exc.fix)}", markup=True, highlight=False)
        out.emit_error(exc.to_json())
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        _interrupted(json_mode)
        return 130
    except TyperException as exc:  # usage errors: unknown command, bad option value
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            print(f"error: {exc.format_message()}", file=sys.stderr)
        (state.output or common.output(json_mode)).emit_error(usage_json(exc))
        return 2
    except Exception as exc:  # a bug: keep the traceback in a file, show one line
        path = _report_bug(exc)
        print(f"error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"the full traceback is in {path}; please report it", file=sys.stderr)
        (state.output or common.output(json_mode)).emit_error(
            {
                "kind": "bug",
                "message": f"unexpected {type(exc).__name__}: {exc}",
                "traceback": str(path),
                "exit_code": 1,
            }
        )
        return 1
