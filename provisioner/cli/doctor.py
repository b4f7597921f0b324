"""`provisioner doctor`: preflight diagnosis of every node."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.cli.common import InventoryOption, JsonOption, output
from provisioner.cluster.subnet import resolve_ray_subnet
from provisioner.console import Output, clean
from provisioner.doctor import DoctorReport, Finding, run_doctor
from provisioner.inventory import load_cluster
from provisioner.remote import Pool
from provisioner.runtime.context import cluster_context

_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green"}


def render(out: Output, report: DoctorReport, *, show_ok: bool) -> None:
    """One table per node, errors first, each finding with its evidence and fix."""
    by_host: dict[str, list[Finding]] = {}
    for f in report.findings:
        if f.severity != "ok" or show_ok:
            by_host.setdefault(f.host, []).append(f)
    for host, findings in by_host.items():
        table = Table(
            "", "check", "finding", title=Text(clean(host)), title_justify="left", expand=True
        )
        for f in findings:
            text = escape(f.message)
            if f.evidence and f.severity != "ok":
                text += f"\n[dim]{escape(f.evidence)}[/dim]"
            if f.fix:
                text += f"\n[bold]fix:[/bold] {escape(f.fix)}"
            table.add_row(
                Text(f.severity, style=_STYLE[f.severity]), f.check, Text.from_markup(clean(text))
            )
        out.out.print(table)
    oks = sum(f.severity == "ok" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    summary = (
        f"{len(report.nodes)} node(s): {len(report.errors)} error(s), {warnings} warning(s), "
        f"{oks} check(s) ok in {report.elapsed_s:.1f}s"
    )
    style = "bold red" if report.errors else "bold green"
    hint = "" if show_ok else " (--all shows the passing checks)"
    out.out.print(f"[{style}]{summary}[/]{hint}", markup=True)


def doctor(
    inventory: InventoryOption,
    json_: JsonOption = False,
    ray_up: Annotated[
        bool, typer.Option("--ray-up", help="Also check what Ray's own `ray up` needs (rsync).")
    ] = False,
    reachability: Annotated[
        bool,
        typer.Option(
            "--reachability/--no-reachability",
            help="Probe Ray's ports between nodes with temporary listeners.",
        ),
    ] = True,
    parallel: Annotated[int, typer.Option("--parallel", help="Nodes at once.", min=1)] = 32,
    show_ok: Annotated[bool, typer.Option("--all", help="Show passing checks too.")] = False,
    gpu_deep: Annotated[
        bool,
        typer.Option(
            "--gpu-deep",
            help="Also start a container of the pinned image on each GPU node, with the GPU "
            "options `up` uses, and check that it sees the GPUs.",
        ),
    ] = False,
) -> None:
    """Diagnose every node before anything starts; exit 1 when any finding is an error."""
    out = output(json_)
    inv = load_cluster(inventory)
    context = cluster_context(inv, lenient_pin=True)  # an unreadable pin is a finding
    with Pool(inv) as pool:
        inv = resolve_ray_subnet(inv, pool, out.progress)
        report = run_doctor(
            context.on(inv),
            pool,
            report=out.progress,
            ray_up=ray_up,
            reachability=reachability,
            parallelism=parallel,
            gpu_deep=gpu_deep,
        )
    if json_:
        out.emit(report.to_json())
    else:
        render(out, report, show_ok=show_ok)
    if report.errors:
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.command("doctor")(doctor)
