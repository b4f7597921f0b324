"""Which of a job's lines a person reads by default, and which are Ray's noise.

Pure. Shown by default: the driver's own prints, errors and every traceback (the
driver's or an actor's), Ray's ERROR lines. Noise, shown only under `--verbose` (job.log
keeps every line either way):
- Python's deprecation warnings (`file.py:12: DeprecationWarning: ...`, RayDeprecation-,
  PendingDeprecation- and FutureWarning too), and any warning raised in Ray's own
  modules (`.../ray/...py:12: UserWarning: ...`), each with its indented lines;
- Ray's own log lines from its modules at DEBUG, INFO or WARNING (`2026-01-01
  10:00:00,123\tINFO worker.py:1 -- ...`, and the C++ processes' `[... I 12 34] ...`), with
  their indented lines (an actor's C++ lines at every level); the supervisor's
  `Running entrypoint for job ...`;
- Tune's status reports (`== Status ==`, `Trial status: ...`, `Trial X started with
  configuration:`, `Trial X reported ...`, `Trial X completed after ...`, their tables):
  the progress line says the same (`jobs.tune_watch`);
- actors' lines (`(Name pid=N, ip=A) ...`), Ray's dedup markers (`[repeated 3x across
  cluster]`) and its note on deduplication, and the lines of Ray's own processes
  (`(raylet)`, `(autoscaler ...)`): an actor's traceback and ERROR lines are shown.

Lines are judged as text without escape sequences (`console.plain`), each source (the
driver, each actor) apart, so that a block's continuation lines go with its first line.
"""

from __future__ import annotations

import re

from provisioner.console import plain

ACTOR = re.compile(r"^\((?:[^()]*? )?pid=\d+(?:, ip=[^()]*)?\)(?: |$)")
RAY_PROCESS = re.compile(r"^\((?:raylet|autoscaler|gcs_server|dashboard|monitor)\b[^()]*\)(?: |$)")
DEDUP = re.compile(r"\[repeated \d+x across cluster\]")
DEDUP_NOTE = "(Ray deduplicates logs by default."
RAY_LOG = re.compile(
    r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\]?\s+"
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+\S+:\d+\s+--(?:\s|$)"
)
RAY_NATIVE_LOG = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (?P<level>[DIWEF]) \d+ \d+\]"
)
QUIET_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "D", "I", "W")
PY_WARNING = re.compile(r"^(?:(?P<file>\S.*?):\d+: )?(?P<category>[A-Za-z_]\w*Warning): ")
DEPRECATIONS = ("DeprecationWarning", "FutureWarning")  # and every *DeprecationWarning
RAY_MODULE = re.compile(r"[/\\]site-packages[/\\]ray[/\\]")
ENTRYPOINT = "Running entrypoint for job "
TRACEBACK = "Traceback (most recent call last):"
TUNE_REPORT = re.compile(
    r"^(?:== Status ==|Trial status: |Trial \S+ (?:started with configuration:|reported |"
    r"completed after |finished iteration )|View detailed results here: |To visualize your "
    r"results with TensorBoard, run: |╭─|\+-{3})"
)
# The lines of a Tune report's block: its tables and figures (a blank line included).
TUNE_BODY = re.compile(
    r"^(?:$|[ \t╭│├╰+|]|Current time: |Using \w+ scheduling|Logical resource usage: |"
    r"Result logdir: |Number of trials: |Total running time)"
)

SHOW, HIDE, TUNE, ACTOR_TRACEBACK = "show", "hide", "tune", "traceback"


def _head(text: str, actor: bool) -> str | None:
    """What a line starts: SHOW, HIDE or TUNE (a block of its continuation lines), or
    None for a line that starts nothing (a continuation, or a plain line)."""
    if text.startswith(TRACEBACK):
        return ACTOR_TRACEBACK if actor else SHOW
    native = RAY_NATIVE_LOG.match(text)
    if native and actor:  # an actor's core worker: its errors reach the driver as Python's
        return HIDE
    log = RAY_LOG.match(text) or native
    if log:
        return HIDE if log.group("level") in QUIET_LEVELS else SHOW
    warning = PY_WARNING.match(text)
    if warning:
        ray_module = RAY_MODULE.search(warning.group("file") or "") is not None
        deprecation = warning.group("category").endswith(DEPRECATIONS)
        return HIDE if ray_module or deprecation else SHOW
    if text.startswith(ENTRYPOINT) or text.startswith(DEDUP_NOTE):
        return HIDE
    if not actor and TUNE_REPORT.match(text):
        return TUNE
    return None


class NoiseFilter:
    """Judges a job's lines in order: `shown(line)` is False for Ray's noise."""

    def __init__(self) -> None:
        self._block: dict[str, str] = {}  # source -> the block now continuing

    def shown(self, line: str) -> bool:
        text = plain(line)
        actor = ACTOR.match(text)
        if RAY_PROCESS.match(text) or DEDUP.search(text) or DEDUP_NOTE in text:
            return False
        source = ""
        if actor:
            source, text = actor.group().rstrip(), text[actor.end() :]
        head = _head(text, actor is not None)
        if head is not None:
            self._block[source] = head
            return head in (SHOW, ACTOR_TRACEBACK)
        block = self._block.get(source, SHOW)
        continuation = not text or text[:1].isspace()
        if block == TUNE and TUNE_BODY.match(text):
            return False
        if block == ACTOR_TRACEBACK:
            if not continuation:  # the exception's own line ends the traceback
                self._block[source] = HIDE
            return True
        if continuation and block == HIDE:
            return False
        self._block[source] = HIDE if actor else SHOW  # a plain line: an actor's is noise
        return not actor


def shown_lines(lines: list[str]) -> list[str]:
    """The lines of `lines` shown by default."""
    judge = NoiseFilter()
    return [line for line in lines if judge.shown(line)]
