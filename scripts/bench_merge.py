"""One record from several bench runs: `bench-results/bench.json` and `bench.md` with
every row of the given runs' bench.json files (a later file's row replaces an earlier
one of the same `id`), each row naming its run (`run`: an index into `runs`, which keeps
each run's command, machine, load and dates). `make bench` writes one run's record; a
row group measured again on its own is merged into the committed record with this.

    .venv/bin/python scripts/bench_merge.py --out bench-results RUN/bench.json [RUN/bench.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import markdown


def runs_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a record holds: its own, or, merged already, its `runs`."""
    if "runs" in doc:
        return list(doc["runs"])
    return [{k: v for k, v in doc.items() if k != "rows"}]


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    rows: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for doc in docs:
        base = len(runs)
        runs += runs_of(doc)
        seen: dict[str, int] = {}
        for row in doc["rows"]:
            # a row without an id is the same row in another run by its group and name (the
            # n-th of that name, should a run name two alike), not by its place in the run
            name = f"{row['group']}/{row['benchmark']}"
            seen[name] = seen.get(name, 0) + 1
            key = row.get("id") or f"{name}/{seen[name]}"
            if key not in rows:
                order.append(key)
            rows[key] = {**row, "run": base + int(row.get("run", 0))}
    used = sorted({r["run"] for r in rows.values()})
    renumber = {old: new for new, old in enumerate(used)}
    return {
        "runs": [runs[i] for i in used],
        "rows": [{**rows[k], "run": renumber[rows[k]["run"]]} for k in order],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("records", nargs="+", type=Path)
    args = p.parse_args(argv)
    doc = merge([json.loads(path.read_text()) for path in args.records])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    (args.out / "bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
