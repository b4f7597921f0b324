"""`provisioner jobs list|logs|stop|results`: jobs after `submit` is gone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from provisioner.cli.common import JsonOption, ResultsOption, output
from provisioner.cli.jobs import (
    AddressOption,
    InventoryFile,
    TokenOption,
    VerboseOption,
    duration_text,
    job_line,
    make_handlers,
    progress_text,
    show_outcome,
)
from provisioner.errors import InputError
from provisioner.jobs.place import Cluster, Submitted, check_job_id, target_for

app = typer.Typer(
    help="Jobs on the cluster: list, logs [--follow], stop, results.", no_args_is_help=True
)


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="jobs")


JobArgument = Annotated[str, typer.Argument(help="The job id (`submit` printed it).")]


@app.command("list")
def list_cmd(
    inventory: InventoryFile = None,
    address: AddressOption = None,
    token_file: TokenOption = None,
    json_: JsonOption = False,
) -> None:
    """Every job: id, playbook, status, started, duration, attempt, and its progress."""
    out = output(json_)
    rows = Cluster(target_for(inventory, address, token_file)).jobs()
    now = time.time()
    if json_:
        out.emit({"jobs": [r.to_json(now) for r in rows]})
        return
    table = Table("job", "playbook", "status", "started", "duration", "try", "progress")
    for r in rows:
        started = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)) if r.started else "-"
        )
        table.add_row(
            r.job_id,
            r.playbook or "-",
            r.status,
            started,
            duration_text(r.duration(now)),
            str(r.attempt),
            progress_text(r.progress) if r.progress else "-",
        )
    out.out.print(table)


@app.command("logs")
def logs_cmd(
    job: JobArgument,
    inventory: InventoryFile = None,
    address: AddressOption = None,
    token_file: TokenOption = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Follow until the job ends (Ctrl-C: stop following)."),
    ] = False,
    results: ResultsOption = Path("results"),
    retries: Annotated[
        int | None,
        typer.Option(
            "--retries",
            min=0,
            help="With --follow: take over the retries of a job submitted here with "
            "--retries (after that client died): repair and resume when a node is lost, "
            "up to N attempts after the first in all.",
        ),
    ] = None,
    verbose: VerboseOption = False,
    json_: JsonOption = False,
) -> None:
    """The job's log; with --follow, its live progress until it ends, results coming home
    as they appear (reconnecting when the stream or the tunnel drops)."""
    out = output(json_)
    job_id = check_job_id(job)
    if retries is not None and not follow:
        raise InputError("--retries takes over a followed job", "add --follow")
    target = target_for(inventory, address, token_file)
    if follow:
        handlers = make_handlers(out, json_, verbose=True if not json_ else verbose)
        place = Cluster(target, results, handlers, retries=retries)
        show_outcome(out, json_, place, place.follow(Submitted(job_id, place.name)))
        return
    lines = Cluster(target).log(job_id)
    if json_:
        out.emit({"job_id": job_id, "lines": lines})
        return
    for line in lines:
        job_line(out.out, line)


@app.command("stop")
def stop_cmd(
    job: JobArgument,
    inventory: InventoryFile = None,
    address: AddressOption = None,
    token_file: TokenOption = None,
    json_: JsonOption = False,
) -> None:
    """Stop the job and wait until it has stopped (its results stay on the head)."""
    out = output(json_)
    job_id = check_job_id(job)
    status, message = Cluster(target_for(inventory, address, token_file)).stop(job_id)
    if json_:
        out.emit({"job_id": job_id, "status": status, "message": message})
    else:
        out.say(f"job {job_id}: {status}")


@app.command("results")
def results_cmd(
    job: JobArgument,
    inventory: InventoryFile = None,
    results: ResultsOption = Path("results"),
    json_: JsonOption = False,
) -> None:
    """Bring what the job has written so far home into RESULTS/JOB/ (over SSH, only what
    is new or changed, each file verified by size and sha256), and draw its plots."""
    out = output(json_)
    job_id = check_job_id(job)
    found = Cluster(target_for(inventory, None, None), results).bring_home(job_id)
    if json_:
        out.emit({"job_id": job_id, **found.to_json()})
    else:
        sent = found.pulled
        if sent is not None:
            out.say(
                f"{len(sent.sent)} file(s) sent ({sent.bytes_sent} bytes), "
                f"{sent.unchanged} already home; results in {found.directory}"
            )
            for name in sent.pending:
                out.say(f"still changing on the head (run again): {name}")
            for line in sent.refused:
                out.err.print(f"refused: {escape(line)}", markup=True, highlight=False)
        for plot in found.plots:
            out.say(f"plot: {plot}")
        if found.missing:
            out.say(f"no result files: {found.missing}")
    if found.pulled is not None and (not found.pulled.found or found.pulled.refused):
        raise typer.Exit(1)
