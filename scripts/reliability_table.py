"""The Reliability table of docs/reliability.md, rendered from the suite's own record
(build/reliability.json).

    .venv/bin/python scripts/reliability_table.py           # print the table
    .venv/bin/python scripts/reliability_table.py --write   # into the page: make reliability-table
    .venv/bin/python scripts/reliability_table.py --check   # exit 1 if the page's table differs

The page is docs/reliability.md (`--page` names another).

Every row is one scenario a test recorded (tests/e2e/faults/record.py): what must happen,
what the test asserted and found to hold, and what it measured in that run. The last two
are rendered here from the values the test checked: a scenario records a template (its
`observed`, its `measured`) and the values it asserted or measured (`values`, `measures`),
and `fill` writes each value into its `{name}` (a list as its items, comma-separated). A
template that names a value the test did not record, a recorded value the template does
not show, or a template that shows no value at all is an error: the column cannot say
more, or other, than what was checked. A passed scenario that recorded no `values` (prose
alone), or a `measured` text without `measures`, is refused the same way. The table
lists exactly the rows the record holds, sorted (faults first, then by name), so a new
recording test needs nothing here: re-render the page with `make reliability-table`.
`--check` compares every column but the last: the measurements differ from run to run
and are shown for what they are (the figures of the run that rendered the table).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import string
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "build" / "reliability.json"
PAGE = ROOT / "docs" / "reliability.md"
BEGIN = (
    "<!-- reliability-table: rendered by `make reliability-table` from build/reliability.json -->"
)
END = "<!-- end of reliability-table -->"
HEADER = [
    "| kind | scenario | expected | asserted by the suite, every run "
    "| measured in the rendering run |",
    "|---|---|---|---|---|",
]


def cell(text: object) -> str:
    """One table cell: pipes escaped, one line, printable characters only."""
    flat = str(text).replace("\n", " ")
    return "".join(c for c in flat if c.isprintable()).replace("|", "\\|").strip()


class TemplateError(ValueError):
    """A scenario's template and the values it recorded do not match."""


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, list | tuple | set | frozenset):
            items = sorted(value) if isinstance(value, set | frozenset) else value
            return ", ".join(self.format_field(v, format_spec) for v in items)
        return str(super().format_field(value, format_spec))


def fields_of(template: str) -> set[str]:
    """The value names a template shows (`{exit}`, `{seconds:.1f}`: exit, seconds)."""
    names = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None:
            if not name.isidentifier():
                raise TemplateError(f"`{{{name}}}` in {template!r} is not a value's name")
            names.add(name)
    return names


def fill(template: str, values: Mapping[str, Any], what: str = "observed") -> str:
    """`template` with each `{name}` replaced by the value the test recorded under it."""
    names = fields_of(template)
    if not names:
        raise TemplateError(f"the {what} template shows none of the values it checked")
    missing, unshown = names - set(values), set(values) - names
    if missing:
        raise TemplateError(f"the {what} template names {sorted(missing)}, never recorded")
    if unshown:
        raise TemplateError(f"the {what} template does not show {sorted(unshown)}")
    return _Formatter().vformat(template, (), dict(values))


def filled(r: Mapping[str, Any], column: str, values: str) -> str:
    """The entry's `column` (observed or measured), filled from its `values`. An observed
    column without values (prose alone) is a TemplateError, and so is a measured one,
    but for an empty measured column (nothing measured)."""
    text = str(r.get(column, ""))
    if not r.get(values) and column == "measured" and not text:
        return ""
    if not r.get(values):
        raise TemplateError(
            f"the {column} column records no values ({values}): prose alone is not "
            "shown; record what the test checked (s.expect, s.saw, s.measure)"
        )
    return fill(text, r[values], column)


def rendered(r: Mapping[str, Any], column: str, values: str) -> str:
    """`filled`, or exit naming the scenario."""
    try:
        return filled(r, column, values)
    except (TemplateError, KeyError, ValueError, IndexError) as exc:
        raise SystemExit(f"{r['scenario']}: {exc}") from None


def rows(record: dict[str, dict[str, object]]) -> list[list[str]]:
    entries = sorted(
        record.values(), key=lambda r: (str(r.get("kind")) != "fault", str(r["scenario"]))
    )
    out = []
    for r in entries:
        asserted = (
            rendered(r, "observed", "values")
            if r.get("passed")
            else "**FAILED**: " + str(r.get("observed", "")).removeprefix("FAILED: ")
        )
        out.append(
            [
                cell(r.get("kind", "")),
                cell(r["scenario"]),
                cell(r["expected"]),
                cell(asserted),
                cell(rendered(r, "measured", "measures") if r.get("passed") else ""),
            ]
        )
    return out


def table(record: dict[str, dict[str, object]]) -> str:
    lines = [*HEADER, *("| " + " | ".join(row) + " |" for row in rows(record))]
    return "\n".join(lines) + "\n"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def page_block(text: str, name: str = "docs/reliability.md") -> tuple[int, int]:
    """The character span between the markers in the page (exclusive of them)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{name} has no `{BEGIN}` ... `{END}` block")
    return start + len(BEGIN), end


def comparable(table_text: str) -> list[list[str]]:
    """The table's rows without the last (measured) column."""
    return [_cells(line)[:-1] for line in table_text.strip().splitlines() if line.startswith("|")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("record", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument(
        "--page", type=Path, default=PAGE, help="the page that holds the table's markers"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="render the table into the page")
    mode.add_argument("--check", action="store_true", help="exit 1 if the page's table differs")
    args = parser.parse_args(argv)
    if not args.record.exists():
        print(
            f"no record at {args.record}: run the end-to-end tests first (make e2e)",
            file=sys.stderr,
        )
        return 2
    record = json.loads(args.record.read_text())
    rendered = table(record)
    if not (args.write or args.check):
        sys.stdout.write(rendered)
        return 0
    text = args.page.read_text()
    start, end = page_block(text, str(args.page))
    if args.write:
        args.page.write_text(text[:start] + "\n" + rendered + text[end:])
        print(f"{args.page}: Reliability table rendered from {args.record} ({len(record)} rows)")
        return 0
    failed = [str(r["scenario"]) for r in record.values() if not r.get("passed")]
    want, have = comparable(rendered), comparable(text[start:end])
    if want == have and not failed:
        print(f"{args.page}: the Reliability table matches {args.record} ({len(record)} rows)")
        return 0
    if failed:
        print(f"scenarios that failed in the record: {', '.join(failed)}", file=sys.stderr)
    if want != have:
        diff = difflib.unified_diff(
            [" | ".join(r) for r in have],
            [" | ".join(r) for r in want],
            str(args.page),
            str(args.record),
            lineterm="",
        )
        print("\n".join(diff), file=sys.stderr)
        print(
            "the Reliability table in docs/reliability.md differs from what the suite recorded: "
            "re-render it with `make reliability-table` (and read the diff above)",
            file=sys.stderr,
        )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
