"""docs/reliability.md's Reliability table from the suite's record: rendering, writing, checking."""

from __future__ import annotations

import importlib.util
import json
import re
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
        "observed": "{what} held",
        "values": {"what": name},
        "measured": "{seconds} s",
        "measures": {"seconds": 1.0},
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
    rec.write_text(json.dumps({"a": entry("a", measures={"seconds": 9.9})}))
    assert run(rt, rec, "--page", page, "--check") == 0
    rec.write_text(json.dumps({"a": entry("a", values={"what": "something else"})}))
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


def templated(name: str) -> dict[str, object]:
    return entry(
        name,
        observed="exit {exit}; {served} others served: {nodes}",
        values={"exit": 1, "served": 2, "nodes": ["w1", "w2"]},
        measured="{seconds:.1f} s",
        measures={"seconds": 3.14159},
    )


def test_the_observed_column_is_filled_from_the_values_checked(rt: ModuleType) -> None:
    (line,) = rt.table({"a": templated("a")}).splitlines()[2:]
    assert line == "| fault | a | it \\| holds | exit 1; 2 others served: w1, w2 | 3.1 s |"


@pytest.mark.parametrize(
    ("template", "values", "says"),
    [
        ("exit {exit}", {}, "never recorded"),  # a value the test did not check
        ("exit {exit}", {"exit": 1, "served": 2}, "does not show"),  # a value checked but not shown
        ("exit 1, as prose", {}, "shows none"),  # prose alone
        ("exit {exit}; {served}", {"exit": 1}, "['served'], never recorded"),
        ("exit {0}", {"exit": 1}, "not a value's name"),
    ],
)
def test_a_template_that_does_not_match_its_values_is_refused(
    rt: ModuleType, template: str, values: dict[str, object], says: str
) -> None:
    with pytest.raises(rt.TemplateError, match=re.escape(says)):
        rt.fill(template, values)


def test_a_changed_value_fails_the_check_a_changed_measure_does_not(
    rt: ModuleType, tmp_path: Path
) -> None:
    rec, page = files(tmp_path, {"a": templated("a")})
    assert run(rt, rec, "--page", page, "--write") == 0
    assert "| exit 1; 2 others served: w1, w2 | 3.1 s |" in page.read_text()
    rec.write_text(json.dumps({"a": templated("a") | {"measures": {"seconds": 99.0}}}))
    assert run(rt, rec, "--page", page, "--check") == 0
    changed = templated("a")
    changed["values"] = {"exit": 0, "served": 2, "nodes": ["w1", "w2"]}
    rec.write_text(json.dumps({"a": changed}))
    assert run(rt, rec, "--page", page, "--check") == 1


def test_a_record_whose_template_does_not_match_is_an_error(rt: ModuleType, tmp_path: Path) -> None:
    broken = templated("a") | {"values": {"exit": 1}}
    rec, page = files(tmp_path, {"a": broken})
    with pytest.raises(SystemExit, match="a: the observed template names"):
        run(rt, rec, "--page", page, "--write")


def test_a_scenario_records_its_values_and_fails_on_a_template_that_does_not_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.e2e.faults import record

    monkeypatch.setattr(record, "RECORD", tmp_path / "reliability.json")
    with record.scenario("ok", "holds") as s:
        s.expect("exit", 1, 1)
        s.saw(nodes={"b", "a"})
        s.observed = "exit {exit} on {nodes}"
        s.measure(seconds=1.25)
        s.measured = "{seconds:.1f} s"
    with (
        pytest.raises(AssertionError, match="exit: 0, expected 1"),
        record.scenario("no", "x") as s,
    ):
        s.expect("exit", 0, 1)
    with pytest.raises(ValueError, match="does not show"), record.scenario("bad", "x") as s:
        s.saw(exit=1, served=2)
        s.observed = "exit {exit}"
    saved = json.loads((tmp_path / "reliability.json").read_text())
    assert saved["ok"]["values"] == {"exit": 1, "nodes": ["a", "b"]} and saved["ok"]["passed"]
    assert not saved["no"]["passed"] and saved["no"]["observed"] == "FAILED: exit: 0, expected 1"
    assert not saved["bad"]["passed"] and "does not show" in saved["bad"]["observed"]
    rt_module = record._renderer()
    lines = rt_module.table(saved).splitlines()
    assert "| fault | ok | holds | exit 1 on a, b | 1.2 s |" in lines


@pytest.mark.parametrize(
    ("column", "values", "empty"),
    [
        ("observed", "values", None),  # prose, no values at all
        ("observed", "values", {}),
        ("measured", "measures", None),
        ("measured", "measures", {}),
    ],
)
def test_an_entry_of_prose_without_values_is_refused(
    rt: ModuleType, tmp_path: Path, column: str, values: str, empty: dict[str, object] | None
) -> None:
    """A passed scenario must show the values it checked: a column written as prose alone
    (an entry without values) is not rendered, so no test can go back to prose."""
    prose = entry("a", observed="exit 1; the others served", measured="3.1 s")
    prose |= {"measures" if column == "observed" else "values": {"x": 1}}
    prose["observed" if column == "measured" else "measured"] = "{x}"
    if empty is None:
        del prose[values]
    else:
        prose[values] = empty
    with pytest.raises(rt.TemplateError, match=f"the {column} column records no values"):
        rt.filled(prose, column, values)
    rec, page = files(tmp_path, {"a": prose})
    with pytest.raises(SystemExit, match=f"a: the {column} column records no values"):
        run(rt, rec, "--page", page, "--write")
    assert "| a |" not in page.read_text()
    with pytest.raises(SystemExit, match="records no values"):
        run(rt, rec, "--page", page, "--check")
    # positive control: an entry with its values renders
    rec.write_text(json.dumps({"a": entry("a")}))
    assert run(rt, rec, "--page", page, "--write") == 0
    assert "| fault | a | it \\| holds | a held | 1.0 s |" in page.read_text()


def test_nothing_measured_is_an_empty_column_not_an_error(rt: ModuleType) -> None:
    quiet = entry("a", measured="")
    del quiet["measures"]
    (line,) = rt.table({"a": quiet}).splitlines()[2:]
    assert line == "| fault | a | it \\| holds | a held |  |"


def test_a_scenario_of_prose_alone_fails_when_the_test_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.e2e.faults import record

    monkeypatch.setattr(record, "RECORD", tmp_path / "reliability.json")
    with (
        pytest.raises(ValueError, match="the observed column records no values"),
        record.scenario("prose", "x") as s,
    ):
        s.observed = "exit 1; the others served"
    with (
        pytest.raises(ValueError, match="the measured column records no values"),
        record.scenario("prose measured", "x") as s,
    ):
        s.saw(exit=1)
        s.observed = "exit {exit}"
        s.measured = "3.1 s"
    saved = json.loads((tmp_path / "reliability.json").read_text())
    assert not saved["prose"]["passed"] and not saved["prose measured"]["passed"]
    assert "records no values" in saved["prose"]["observed"]
