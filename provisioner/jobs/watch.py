"""The command that starts `tune_watch` beside a job's driver (pure; `JobSpec.entrypoint`).

The watcher travels inside the command itself, so every place that runs the entrypoint
runs it with nothing installed there: its source without docstrings, compressed, as a
`python3 -I -S -c` one-liner (isolated: the job's folder on sys.path, its environment and
site-packages cannot change what it runs), in the job's own Python.
"""

from __future__ import annotations

import ast
import base64
import functools
import shlex
import zlib
from pathlib import Path

SOURCE = Path(__file__).with_name("tune_watch.py")
RESUME_SOURCE = Path(__file__).with_name("tune_resume.py")


@functools.cache
def compact_source(source: Path = SOURCE) -> str:
    """A file (tune_watch.py) without its docstrings and comments (what runs is what is
    tested)."""
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[:1] = [] if len(body) > 1 else [ast.Pass()]
    return ast.unparse(tree)


def watcher_command(python: str, pid: str) -> str:
    """`PYTHON -I -S -c '...' PID`: the watcher of the driver PID (a shell word: `$$`,
    `"$drv"`), its output on the job's standard output."""
    return f"{python} -I -S -c {shlex.quote(_inline(SOURCE))} {pid}"


def _inline(source: Path) -> str:
    blob = base64.b64encode(zlib.compress(compact_source(source).encode(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{blob}')))"


def tune_resume_argv(python: str, script: str, args: tuple[str, ...]) -> list[str]:
    """`PYTHON -u -c '...' SCRIPT ARGS`: the script run as `python -u SCRIPT ARGS` would
    run it, its first `Tuner(...)` the experiment `jobs.tune_resume` places, restored
    (in the job's own Python, with its site-packages: not isolated)."""
    return [python, "-u", "-c", _inline(RESUME_SOURCE), script, *args]
