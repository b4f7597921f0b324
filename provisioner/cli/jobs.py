"""`provisioner submit` and `provisioner jobs ...`: run a playbook on the cluster, follow
it, and work with it after `submit` is gone (list, logs, stop, results)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.cli.common import JsonOption, ResultsOption, output
from provisioner.console import Output, plain, sgr_only
from provisioner.errors import InputError
from provisioner.jobs.place import (
    DEFAULT_METRIC,
    Cluster,
    Handlers,
    JobOutcome,
    NoiseFilter,
    Place,
    Target,
    Upload,
    asks_for_help,
    evaluate,
    experiment_spec,
    find_checkpoint,
    is_experiment,
    local_help,
    make_spec,
    prepare_experiment,
    priced,
    read_eval,
    read_experiment,
    read_rows,
    target_for,
    upload_for,
    upload_line,
)
from provisioner.remote.pull import Pulled

METRIC_NAME = re.compile(r"[A-Za-z0-9_./:-]{1,40}")  # as the watcher sends them

InventoryFile = Annotated[
    Path | None,
    typer.Option(
        "-i",
        "--inventory",
        help="Inventory file; the dashboard is reached through an SSH tunnel to its head.",
        envvar="PROVISIONER_INVENTORY",
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="A dashboard URL already reachable (e.g. `provisioner tunnel`); opens no tunnel.",
    ),
]
TokenOption = Annotated[
    Path | None,
    typer.Option("--token-file", help="The cluster's token (default: the inventory's)."),
]


DetachOption = Annotated[
    bool, typer.Option("--detach", "-d", help="Print the job id and return; the job runs on.")
]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Show Ray's noise too (deprecation warnings, its log lines, repeated actor "
        "lines); by default the job's own output, errors and progress only.",
    ),
]


def submit_cmd(
    playbook: Annotated[
        Path,
        typer.Argument(
            help="The playbook (a Python file) or an experiment file (.yaml, .yml).",
            metavar="FILE",
        ),
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the playbook, after `--`.")
    ] = None,
    inventory: InventoryFile = None,
    address: AddressOption = None,
    token_file: TokenOption = None,
    results: ResultsOption = Path("results"),
    detach: DetachOption = False,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            help="Continue from the latest checkpoint of JOB (or from a checkpoint PATH).",
            metavar="JOB|PATH",
        ),
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="When a node is lost or the head restarts: repair (up) and resume, N times.",
        ),
    ] = 0,
    price: Annotated[
        float | None,
        typer.Option(
            "--price-per-hour",
            min=0.0,
            help="What one node-hour costs, for the run's cost in summary.json "
            "(default: the inventory's price_per_node_hour).",
        ),
    ] = None,
    max_concurrent: Annotated[
        int | None,
        typer.Option(
            "--max-concurrent",
            min=1,
            help="An experiment file's sweep: at most N trials at once (default: as many as "
            "the cluster's resources allow).",
        ),
    ] = None,
    verbose: VerboseOption = False,
    show_upload: Annotated[
        bool,
        typer.Option(
            "--show-upload",
            help="List the files that would be sent (secrets left out) and stop; no cluster.",
        ),
    ] = False,
    json_: JsonOption = False,
) -> None:
    """Run PLAYBOOK on the cluster as a Ray job; its directory travels as the working_dir.

    An experiment file (EXPERIMENT.yaml, RLlib's tuned-example shape: NAME with env, run,
    stop, config) is validated first against the image and the cluster (exit 2 naming each
    bad line), then run through Tune; RESULTS/JOB/ keeps experiment.yaml and config.json.

    Follows the job (its own output and one live progress line, read from the
    playbook's progress lines or from Tune's results; --verbose adds Ray's noise) and brings its
    results home as they appear, into RESULTS/JOB/. Ctrl-C stops following, not the job:
    `provisioner jobs logs JOB --follow` picks it up again. Exit 1 if the job failed.
    """
    out = output(json_)
    experiment = is_experiment(playbook)
    if experiment:
        if args:
            raise InputError(
                f"an experiment file takes no arguments (given: {' '.join(args)})",
                f"set them in {playbook.name} (its config, stop, seeds, resources)",
            )
        spec = experiment_spec(
            read_experiment(playbook)[0], max_concurrent=max_concurrent, max_failures=retries
        )
    else:
        if max_concurrent is not None:
            raise InputError(
                "--max-concurrent bounds the trials of an experiment file's sweep; "
                f"{playbook.name} is a script",
                "set it in your script (tune.TuneConfig(max_concurrent_trials=N)), or drop it",
            )
        spec = make_spec(playbook, args or [])
    if show_upload:
        _show_upload(out, upload_for(spec), json_)
        return
    if asks_for_help(spec.args):
        usage = local_help(spec)
        if usage is not None:
            out.stdout.write(usage)
            return
    target = target_for(inventory, address, token_file)
    handlers = make_handlers(out, json_, verbose)
    if experiment:  # validated before anything is sent (exit 2); kept in RESULTS/JOB/
        spec = prepare_experiment(
            target, playbook, results, handlers.report, max_concurrent, max_failures=retries
        )
    spec = priced(spec, price, target.inventory.price_per_node_hour if target.inventory else None)
    place = Cluster(target, results, handlers, detach=detach, retries=retries or None)
    if resume is not None:
        spec = place.resume(spec, resume)
    outcome = place.run(spec)
    evaluation = read_experiment(playbook)[0].evaluation if experiment else None
    evaluated = True
    if isinstance(evaluation, dict) and outcome.ok and not outcome.detached:
        evaluated = _evaluate_after(out, json_, target, results, outcome, evaluation, handlers)
    show_outcome(out, json_, place, outcome)
    if not evaluated:
        out.err.print("[bold red]the evaluation failed[/bold red]", markup=True)
        raise typer.Exit(1)


def _evaluate_after(
    out: Output,
    json_: bool,
    target: Target,
    results: Path,
    trained: JobOutcome,
    evaluation: dict[str, Any],
    handlers: Handlers,
) -> bool:
    """An experiment file's `evaluation:` once its training ended well: `provisioner eval`
    of the job (its figures shown, and in the job's JSON as `evaluation`); whether it
    ended well (a failed one fails the submit: exit 1, the training's results kept)."""
    episodes = int(evaluation.get("episodes") or 20)
    video = int(evaluation.get("video") or 0)
    found = find_checkpoint(trained.job_id, results)
    outcome = evaluate(target, found, episodes, video, handlers)
    figures = read_eval(outcome.results.directory)
    trained.evaluation = {"job_id": outcome.job_id, "status": outcome.status, "eval": figures}
    if figures is not None and not json_:
        say_figures(out, figures, outcome.results.directory)
    return outcome.ok


def _show_upload(out: Output, upload: Upload, json_: bool) -> None:
    if json_:
        out.emit({**upload.to_json(), "files": upload.files})
        return
    for name in upload.files:
        out.say(name)
    out.say(upload_line(upload))
    out.say(
        "(control it with .gitignore or .rayignore in that directory; "
        "see docs/guide.md, 'What is sent')"
    )


def say_figures(out: Output, figures: dict[str, Any], home: Path) -> None:
    """An evaluation's figures (eval.json) as lines."""
    ci = figures.get("ci95")
    interval = f"; 95% interval of the mean [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    out.say(
        f"return {figures['mean']:.2f} ± {figures['std']:.2f} (std) over "
        f"{figures['episodes']} episodes{interval}"
    )
    training = figures.get("training_return")
    if isinstance(training, int | float):
        out.say(f"training return at the checkpoint {training:.2f}")
    for video in figures.get("videos") or []:
        out.say(f"video: {home / video['file']} (return {video['return']:.2f})")
    if figures.get("video_error"):
        out.say(f"no video: {figures['video_error']}")


def make_handlers(out: Output, json_: bool, verbose: bool) -> Handlers:
    """The job's lines as a person reads them: its own prints, errors and progress; Ray's
    noise (`jobs.noise`) too with `verbose`. Colours kept on a terminal only."""
    line = ProgressLine(out, echoing=verbose or json_)
    judge = NoiseFilter()

    def on_line(text: str) -> None:
        if not (judge.shown(text) or verbose):
            return
        line.clear()
        if json_:
            out.progress(plain(text))
        else:
            job_line(out.out, text)

    def on_pulled(got: Pulled) -> None:
        if got.sent:
            line.clear()
            out.progress(f"results: {len(got.sent)} new file(s), {got.bytes_sent} bytes home")

    def report(text: str) -> None:
        line.clear()
        out.progress(text)  # progress shows node text as text (console.py)

    return Handlers(on_line=on_line, on_progress=line.show, on_pulled=on_pulled, report=report)


def job_line(console: Console, text: str) -> None:
    """One line of a job's output: its colours on a terminal, every other escape sequence
    and control character dropped; plain text elsewhere (a pipe, a file)."""
    if console.is_terminal:
        console.print(Text.from_ansi(sgr_only(text)), highlight=False)
    else:
        console.print(plain(text), markup=False, highlight=False)


class ProgressLine:
    """The one live line of a followed job: rewritten in place on a terminal, one line
    per iteration otherwise, unless the job's own lines are echoed (`--verbose`, `--json`):
    those already say each iteration once, and a log file or CI shows it once.

    A sweep (several trials, `jobs.tune_watch`'s sweep figures): on a terminal the line
    is the sweep's counts and best so far, then the latest trial's figures; otherwise a
    line of the sweep each time its counts or its best trial change, beside each trial's
    own line per iteration."""

    def __init__(self, out: Output, *, echoing: bool = False) -> None:
        self.out = out
        self.live = out.err.is_terminal and not out.json_mode
        self.echoing = echoing
        self.shown = False
        self.sweep: str | None = None  # the sweep's text, once one was said
        self.sweep_key: tuple[Any, ...] | None = None
        self.trial = ""  # the latest trial's text (a terminal's line)

    def show(self, figures: dict[str, Any]) -> None:
        sweep = figures.get("sweep")
        if isinstance(sweep, dict):
            self.sweep = sweep_text(sweep)
            key = sweep_key(sweep)
            if self.live:
                self._draw()
            elif not self.echoing and key != self.sweep_key:
                self.out.progress(self.sweep)
            self.sweep_key = key
            return
        text = progress_text(figures)
        if self.live:
            self.trial = text
            self._draw()
        elif not self.echoing:
            self.out.progress(text)

    def _draw(self) -> None:
        text = self.trial if self.sweep is None else f"{self.sweep}  |  {self.trial}"
        width = max(20, self.out.err.width - 1)  # one screen line: \r rewrites it whole
        self.out.stderr.write("\r\033[2K" + text.rstrip(" |")[:width])
        self.out.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.stderr.write("\r\033[2K")
            self.out.stderr.flush()
            self.shown = False


SWEEP_COUNTS = ("running", "pending", "paused", "done", "failed")
TRIAL_TAG = re.compile(r"[A-Za-z0-9_.,=:+-]{1,80}")  # as the watcher sends it


def sweep_key(s: dict[str, Any]) -> tuple[Any, ...]:
    """What a change of makes a new line where the output is not a terminal: the counts
    and which trial is best (not its value, which moves with every result)."""
    best = s.get("best")
    tag = best.get("trial") if isinstance(best, dict) else None
    counts = tuple(_number(s.get(k)) for k in ("trials", *SWEEP_COUNTS, "repeated"))
    return (*counts, tag)


def sweep_text(s: dict[str, Any]) -> str:
    """`trials 8: 2 running, 3 pending, 3 done (1 run again)  best return 187.30
    (3_lr=0.0003,seed=2)`: the sweep's figures (checked again here: the line may be written
    to a terminal as it is)."""
    trials = _number(s.get("trials"))
    counts = [
        f"{n:.0f} {key}" for key in SWEEP_COUNTS if (n := _number(s.get(key))) is not None and n
    ]
    text = f"trials {trials or 0:.0f}: {', '.join(counts) or 'none started'}"
    repeated = _number(s.get("repeated"))
    if repeated:
        text += f" ({repeated:.0f} run again)"
    best, metric = s.get("best"), s.get("metric")
    value = _number(best.get("value")) if isinstance(best, dict) else None
    if isinstance(best, dict) and value is not None:
        if metric == DEFAULT_METRIC:
            text += f"  best return {value:.2f}"
        else:
            name = metric if isinstance(metric, str) and METRIC_NAME.fullmatch(metric) else "metric"
            text += f"  best {name} {_figure(value)}"
        tag = best.get("trial")
        if isinstance(tag, str) and TRIAL_TAG.fullmatch(tag):
            text += f" ({tag})"
    return text


def _number(value: Any) -> float | None:
    """A figure from the job as a number (anything else, e.g. text with markup: None)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def progress_text(p: dict[str, Any]) -> str:
    """`iter 12  steps 24000/200000 (12%)  return 85.3  1234 steps/s  ETA 2m03s`; from
    Tune's results (`jobs.tune_watch`): `trial 2/4  iter 3  steps 12000  return 85.3`, or
    a plain trainable's own figures, `iter 3  score 2  loss 0.33`."""
    if p.get("source") == "tune":
        sweep = p.get("sweep")
        return sweep_text(sweep) if isinstance(sweep, dict) else tune_text(p)
    it, steps, budget = (_number(p.get(k)) for k in ("iteration", "env_steps", "max_env_steps"))
    ret, rate = _number(p.get("episode_return_mean")), _number(p.get("env_steps_per_s"))
    share = f" ({100 * steps / budget:.0f}%)" if steps is not None and budget else ""
    eta = duration_text(_number(p.get("eta_s")))

    def num(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return (
        f"iter {num(it)}  steps {num(steps)}/{num(budget) if budget else '-'}{share}  "
        f"return {num(ret, 1)}  {num(rate)} steps/s  ETA {eta}"
    )


def _figure(value: float) -> str:
    return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def tune_text(p: dict[str, Any]) -> str:
    """The progress line of a Tune result (its names were checked by the watcher, and are
    checked again: the line may be written to a terminal as it is)."""
    parts = []
    trial, trials = _number(p.get("trial")), _number(p.get("trials"))
    if trial is not None and trials is not None:
        parts.append(f"trial {trial:.0f}/{trials:.0f}")
    for key, name in (("iteration", "iter"), ("env_steps", "steps")):
        value = _number(p.get(key))
        if value is not None:
            parts.append(f"{name} {value:.0f}")
    ret = _number(p.get("episode_return_mean"))
    if ret is not None:
        parts.append(f"return {ret:.2f}")
    metrics = p.get("metrics")
    for name, value in metrics.items() if isinstance(metrics, dict) else ():
        number = _number(value)
        if number is not None and isinstance(name, str) and METRIC_NAME.fullmatch(name):
            parts.append(f"{name} {_figure(number)}")
    return "  ".join(parts) or "training"


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def show_outcome(out: Output, json_: bool, place: Place, outcome: JobOutcome) -> None:
    """How the job ended (JSON, or its tables, cost and plots), and the exit code."""
    if json_:
        out.emit(outcome.to_json())
    else:
        _render(out, place, outcome)
    if outcome.interrupted:
        raise typer.Exit(130)
    if not outcome.ok or outcome.results.refused is not None:
        raise typer.Exit(1)


def _render(out: Output, place: Place, outcome: JobOutcome) -> None:
    found = outcome.results
    if outcome.detached:
        out.say(f"job {outcome.job_id}: {outcome.status}; it runs on the cluster")
        if outcome.interrupted:
            out.say("stopped following; the job was not stopped")
        out.say(f"follow it:     provisioner jobs logs {outcome.job_id} --follow")
        out.say(f"its results:   provisioner jobs results {outcome.job_id}")
        out.say(f"stop it:       provisioner jobs stop {outcome.job_id}")
        return
    if not outcome.ok:
        out.err.print(f"[bold red]job {outcome.job_id} {outcome.status}[/bold red]", markup=True)
        for line in outcome.log_tail:
            job_line(out.err, line)
    for name, title in (("metrics.csv", "training"), ("scaling.csv", "scaling")):
        if found.files and (found.directory / name).is_file():
            try:
                table = csv_table(found.directory / name, title)
            except (ValueError, OSError, csv.Error) as exc:
                found.unreadable.append(f"{name}: {exc}")
                continue
            out.say("")
            out.out.print(table)
    out.say(f"\njob {outcome.job_id}: {outcome.status}; results in {found.directory}")
    cost = place.cost(outcome)
    if cost is not None:
        out.say(cost.text())
    for plot in found.plots:
        out.say(f"plot: {plot}")
    for problem in found.unreadable:
        out.say(f"could not read {problem}")
    for line in found.pulled.refused if found.pulled else []:
        out.err.print(f"refused: {escape(line)}", markup=True, highlight=False)
    if found.refused is not None:
        out.err.print(
            f"[bold red]results refused:[/bold red] {escape(found.refused.message)}",
            markup=True,
            highlight=False,
        )
        if found.refused.fix:
            out.err.print(f"[bold]fix:[/bold] {escape(found.refused.fix)}", markup=True)
    elif found.missing:
        out.say(f"no result files came home: {found.missing}")


# Short headers, so that the scaling table fits 80 columns (the CSV keeps the long names).
HEADERS = {
    "iteration": "iter",
    "iterations": "iters",
    "env_steps": "env steps",
    "episode_return_mean": "return",
    "time_s": "time s",
    "env_steps_per_s": "steps/s",
    "env_runners": "runners",
    "time_to_target_s": "s to target",
}


MAX_ROWS = 200  # the table shows the last rows; the CSV keeps them all


def csv_table(csv_path: Path, title: str) -> Table:
    """A CSV of numbers a playbook wrote (metrics.csv, scaling.csv) as a table."""
    rows = read_rows(csv_path)[-MAX_ROWS:]
    table = Table(title=title, show_edge=False)
    columns = list(rows[0]) if rows else []
    whole = {name: all(_whole(row[name]) for row in rows) for name in columns}
    for name in columns:
        table.add_column(HEADERS.get(name, name), justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(_cell(row[name], whole[name]) for name in columns))
    return table


def _whole(value: float) -> bool:
    return value != value or float(value).is_integer()


def _cell(value: float, whole: bool) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:.0f}" if whole else f"{value:.2f}"


def register(app: typer.Typer) -> None:
    """`provisioner submit` (the `jobs` group is cli/jobs_group.py's, built on these helpers)."""
    app.command("submit")(submit_cmd)
