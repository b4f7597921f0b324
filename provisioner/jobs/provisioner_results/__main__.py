"""`python -m provisioner_results pack DIR`: print DIR as marked lines on stdout.

Run by the job's entrypoint after the playbook, on the head. Exits 0 even when DIR is
missing (a playbook that failed early wrote nothing): it says so on stderr instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import ResultsError, pack


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "pack":
        print("usage: python -m provisioner_results pack DIR", file=sys.stderr)
        return 2
    directory = Path(argv[1])
    if not directory.is_dir():
        print(f"provisioner: no results directory {directory} to bring home", file=sys.stderr)
        return 0
    skipped: list[str] = []
    try:
        for line in pack(directory, skipped):
            sys.stdout.write(line + "\n")
    except ResultsError as exc:
        print(f"provisioner: results not sent: {exc}", file=sys.stderr)
    for name in skipped:
        print(f"provisioner: {name} not sent (not a regular file or directory)", file=sys.stderr)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
