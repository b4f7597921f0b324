"""docs/reliability.md's Reliability table from the suite's record: rendering, writing, checking."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reliability_table.py"


@pytest.fixture(scope="module")
def rt() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability_table", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(name: str, kind: str = "fault", **more: object) -> dict[str, object]:
    return {
        "scenario": name,
        "kind": kind,
        "expected": "it | holds",
        "observed": f"{name} held",
        "measured": "1.0 s",
        "passed": True,
        **more,
    }


def files(tmp_path: Path, record: dict[str, dict[str, object]]) -> tuple[Path, Path]:
    rec = tmp_path / "reliability.json"
    rec.write_text(json.dumps(record))
    page = tmp_path / "reliability.md"
    page.write_text(
        "# x\n\n## Reliability\ntext\n\n"
        "<!-- reliability-table: rendered by `make reliability-table` from "
        "build/reliability.json -->\n<!-- end of reliability-table -->\n\n## After\nmore\n"
    )
    return rec, page


def run(rt: ModuleType, *args: object) -> int:
    return int(rt.main([str(a) for a in args]))


def test_rows_sorted_faults_first_and_pipes_escaped(rt: ModuleType) -> None:
    record = {n: entry(n, k) for n, k in [("b", "security"), ("z", "fault"), ("a", "fault")]}
    lines = rt.table(record).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:]] == ["a", "z", "b"]
    assert "it \\| holds" in lines[2]


def test_written_table_passes_the_check_and_keeps_the_rest(rt: ModuleType, tmp_path: Path) -> None:
    rec, page = files(tmp_path, {"a": entry("a")})
    assert run(rt, rec, "--page", page, "--check") == 1  # empty block: differs
    assert run(rt, rec, "--page", page, "--write") == 0
    text = page.read_text()
    assert "| fault | a | it \\| holds | a held | 1.0 s |" in text
    assert text.startswith("# x\n") and text.endswith("## After\nmore\n")
    assert run(rt, rec, "--page", page, "--check") == 0
    assert run(rt, rec, "--page", page, "--write") == 0  # idempotent
    assert page.read_text() == text


def test_only_the_measured_column_may_change(rt: ModuleType, tmp_path: Path) -> None:
    rec, page = files(tmp_path, {"a": entry("a")})
    run(rt, rec, "--page", page, "--write")
    rec.write_text(json.dumps({"a": entry("a", measured="9.9 s")}))
    assert run(rt, rec, "--page", page, "--check") == 0
    rec.write_text(json.dumps({"a": entry("a", observed="something else")}))
    assert run(rt, rec, "--page", page, "--check") == 1


def test_a_new_row_or_a_failed_one_fails_the_check(rt: ModuleType, tmp_path: Path) -> None:
    rec, page = files(tmp_path, {"a": entry("a")})
    run(rt, rec, "--page", page, "--write")
    rec.write_text(json.dumps({"a": entry("a"), "b": entry("b", "security")}))
    assert run(rt, rec, "--page", page, "--check") == 1
    run(rt, rec, "--page", page, "--write")  # re-rendered: the new row is in
    assert run(rt, rec, "--page", page, "--check") == 0
    failed = entry("a", passed=False, observed="FAILED: boom")
    rec.write_text(json.dumps({"a": failed, "b": entry("b", "security")}))
    assert run(rt, rec, "--page", page, "--check") == 1
    assert "**FAILED**: boom" in rt.table(json.loads(rec.read_text()))


def test_no_record_is_exit_2(rt: ModuleType, tmp_path: Path) -> None:
    assert run(rt, tmp_path / "none.json", "--check") == 2


def test_cells_are_one_printable_line(rt: ModuleType) -> None:
    assert rt.cell("a\nb\x00\x18c | d") == "a bc \\| d"


def test_the_default_page_holds_the_rendered_table(rt: ModuleType) -> None:
    """`make reliability-check` reads docs/reliability.md: its markers and a rendered table."""
    assert rt.PAGE.relative_to(SCRIPT.parents[1]).as_posix() == "docs/reliability.md"
    text = rt.PAGE.read_text()
    start, end = rt.page_block(text)
    rows = rt.comparable(text[start:end])
    assert rows[0] == [c.strip() for c in rt.HEADER[0].strip("|").split("|")][:-1]
    assert len(rows) > 2  # the header, its rule, and at least one scenario
