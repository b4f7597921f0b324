"""`provisioner submit`: run a playbook on the cluster, stream it, bring its results home."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from provisioner.cli.common import JsonOption, output
from provisioner.console import Output
from provisioner.errors import InputError
from provisioner.jobs import JobOutcome, make_spec, submit
from provisioner.jobs.submit import upload_for, upload_line
from provisioner.jobs.tables import read_rows
from provisioner.jobs.upload import Upload

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
ResultsOption = Annotated[
    Path, typer.Option("--results", help="Where results/JOB/ directories are made.")
]


@contextmanager
def _dashboard(
    inventory: Path | None, address: str | None, token_file: Path | None, out: Output
) -> Iterator[tuple[str, Path | None]]:
    """The dashboard URL and the token path: given, or through the inventory's tunnel."""
    if address is not None:
        if token_file is None and inventory is None:
            raise InputError(
                "--address needs the cluster's token",
                "add --token-file PATH, or -i INVENTORY to use the inventory's token",
            )
        yield address, token_file or _token_path(inventory)
        return
    if inventory is None:
        raise InputError("no inventory given", "add -i INVENTORY (or set PROVISIONER_INVENTORY)")
    from provisioner.cluster.tunnel import tunnel
    from provisioner.inventory import load_inventory

    inv = load_inventory(inventory)
    with tunnel(inv) as url:
        out.progress(f"dashboard of {inv.cluster} tunnelled to {url}")
        yield url, token_file or _token_path(inventory)


def _token_path(inventory: Path | None) -> Path:
    from provisioner.cluster import token
    from provisioner.inventory import load_inventory

    assert inventory is not None
    return token.local_token_path(load_inventory(inventory))


def submit_cmd(
    playbook: Annotated[Path, typer.Argument(help="The playbook, a Python file.")],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the playbook, after `--`.")
    ] = None,
    inventory: InventoryFile = None,
    address: AddressOption = None,
    token_file: TokenOption = None,
    results: ResultsOption = Path("results"),
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

    Streams the job's output; Ctrl-C stops the job. At the end its results (metrics,
    checkpoint, TensorBoard events, plots) are in RESULTS/JOB/. Exit 1 if the job failed.
    """
    out = output(json_)
    spec = make_spec(playbook, args or [])
    if show_upload:
        _show_upload(out, upload_for(spec), json_)
        return
    on_line = out.progress if json_ else _echo(out)
    with _dashboard(inventory, address, token_file, out) as (url, token_path):
        outcome = submit(url, token_path, spec, results, on_line=on_line, report=out.progress)
    if json_:
        out.emit(outcome.to_json())
    else:
        _render(out, outcome)
    if outcome.interrupted:
        raise typer.Exit(130)
    if not outcome.ok or outcome.results.refused is not None:
        raise typer.Exit(1)


def _show_upload(out: Output, upload: Upload, json_: bool) -> None:
    if json_:
        out.emit({**upload.to_json(), "files": upload.files})
        return
    for name in upload.files:
        out.say(name)
    out.say(upload_line(upload))
    out.say("(control it with .gitignore or .rayignore in that directory; see the README)")


def _echo(out: Output) -> Callable[[str], None]:
    def line(text: str) -> None:
        out.out.print(escape(text), markup=True, highlight=False)

    return line


def _render(out: Output, outcome: JobOutcome) -> None:
    found = outcome.results
    if not outcome.ok:
        out.err.print(f"[bold red]job {outcome.job_id} {outcome.status}[/bold red]", markup=True)
        for line in outcome.log_tail:
            out.err.print(escape(line), markup=True, highlight=False)
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
    for plot in found.plots:
        out.say(f"plot: {plot}")
    for problem in found.unreadable:
        out.say(f"could not read {problem}")
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
    app.command("submit")(submit_cmd)
