"""Render the fault and security suite's record (build/reliability.json) as Markdown.

    .venv/bin/pytest -m e2e tests/e2e/test_faults.py tests/e2e/test_security.py
    .venv/bin/python scripts/reliability_table.py [RECORD.json] > table.md

One row per scenario: what must happen, what the last run observed, and whether it passed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "build" / "reliability.json"


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(record: dict[str, dict[str, object]]) -> str:
    rows = sorted(
        record.values(), key=lambda r: (str(r.get("kind")) != "fault", str(r["scenario"]))
    )
    lines = [
        "| kind | scenario | expected | observed in the suite | result |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = "pass" if r.get("passed") else "**FAIL**"
        lines.append(
            f"| {cell(r.get('kind', ''))} | {cell(r['scenario'])} | {cell(r['expected'])} "
            f"| {cell(r.get('observed', ''))} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else DEFAULT
    if not path.exists():
        print(f"no record at {path}: run the fault and security suites first", file=sys.stderr)
        return 2
    sys.stdout.write(table(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
