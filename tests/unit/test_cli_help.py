"""Every command's `--help`, as a user sees it (issue 47, items 10 and 12): rendered by the
CLI's own entry with rich formatting on, walked over the whole command tree; and help text
taken from docstrings reads as written, a paragraph a line (wrapped only by the terminal)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main

from provisioner.cli import whole_app
from tests.cli import cli


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(typer.main.get_command(whole_app())))


def test_the_walk_finds_every_command() -> None:
    """Positive control: the tree walked holds the commands and the subcommands."""
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "up", "submit", "sagemaker render", "lab fault break", "jobs logs"} <= paths
    assert len(paths) > 30, sorted(paths)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_renders(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 0 and the help itself, no error, no traceback; each paragraph of the command's
    own help on one line of a wide terminal (no break where the docstring had one)."""
    monkeypatch.setenv("COLUMNS", "1000")
    run = cli(*path, "--help")
    shown = run.stdout + run.stderr
    assert run.exit_code == 0, shown[-3000:]
    assert "Traceback" not in shown and "error" not in run.stderr.lower(), shown[-3000:]
    assert "Usage: provisioner" in run.stdout, shown[-3000:]
    command = dict(COMMANDS)[path]
    text = inspect.cleandoc(command.help or "").split("\f")[0]
    lines = [line.strip() for line in run.stdout.splitlines()]
    for paragraph in text.split("\n\n"):
        joined = " ".join(part.strip() for part in paragraph.splitlines() if part.strip())
        assert joined in lines, (joined, run.stdout[:3000])


def test_submit_help_keeps_its_sentence_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: "brings its" / "results home" broke where the docstring did."""
    monkeypatch.setenv("COLUMNS", "1000")
    run = cli("submit", "--help")
    assert run.exit_code == 0
    assert "brings its results home as they appear" in run.stdout, run.stdout


def test_markup_in_help_is_shown_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's crash: `s3://BUCKET[/PREFIX]` in --bucket's help is text, not a style."""
    monkeypatch.setenv("COLUMNS", "1000")
    run = cli("sagemaker", "render", "--help")
    assert run.exit_code == 0, run.stderr
    assert "s3://BUCKET[/PREFIX] for code, checkpoints." in run.stdout, run.stdout


def test_prose() -> None:
    from provisioner.cli import prose

    doc = """First line
    goes on.

    A second paragraph
      with an indented line, and [bold]markup[/bold] and [/PREFIX].
    """
    assert prose(doc) == (
        "First line goes on.\n\n"
        "A second paragraph with an indented line, and \\[bold]markup\\[/bold] and \\[/PREFIX]."
    )
    assert prose("") == ""
