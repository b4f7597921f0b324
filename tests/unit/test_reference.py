"""docs/reference.md is what the CLI itself says (scripts/reference.py makes it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "scripts" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_the_cli_and_names_every_environment_variable() -> None:
    ref = _reference()
    assert ref.problems() == []
    text = (ROOT / "docs" / "reference.md").read_text()
    for must in ("### `provisioner up`", "`--push <str>`", "`PROVISIONER_STATE_DIR`"):
        assert must in text


def test_a_flag_missing_from_the_reference_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from provisioner.cli import app

    ref = _reference()
    extra = typer.Typer()

    @extra.command("brand-new")
    def brand_new(flag: bool = typer.Option(False, "--brand-new-flag", help="New.")) -> None:
        """A command the reference does not know yet."""

    monkeypatch.setattr(
        app, "registered_commands", [*app.registered_commands, *extra.registered_commands]
    )
    found = ref.problems()
    assert len(found) == 1 and "--brand-new-flag" in found[0], found
    monkeypatch.undo()
    assert ref.problems() == []


def test_an_undescribed_environment_variable_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _reference()
    named = ref.names_in_code()
    monkeypatch.setattr(ref, "names_in_code", lambda: named | {"PROVISIONER_NEW_THING"})
    assert ref.problems() == ["PROVISIONER_NEW_THING: named in the code, not in ENVIRONMENT"]


def test_every_command_runs_with_only_its_own_group_imported() -> None:
    """`provisioner CMD` builds the command line of CMD's group alone: each command of the
    whole command line is there, with the same options."""
    import typer

    from provisioner.cli import app_for, whole_app

    whole = typer.main.get_command(whole_app())
    names = list(whole.commands)  # type: ignore[attr-defined]
    assert {"up", "doctor", "image", "jobs", "lab", "submit"} <= set(names)
    for name in names:
        part = typer.main.get_command(app_for([name, "--help"]))
        mine = part.commands[name]  # type: ignore[attr-defined]
        options = [p.opts for p in mine.params]
        assert options == [p.opts for p in whole.commands[name].params], name  # type: ignore[attr-defined]
