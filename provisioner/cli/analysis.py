"""`provisioner compare` (runs home in RESULTS/ compared: plot and table; no cluster needed)
and `provisioner eval` (a checkpoint evaluated on the cluster, with videos)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from provisioner.cli.common import JsonOption, ResultsOption, output


def register(parent: typer.Typer) -> None:
    parent.command("compare")(compare_cmd)
    parent.command("eval")(eval_cmd)


RunsArgument = Annotated[
    list[str],
    typer.Argument(
        help="Runs to compare: job ids home under --results (or folders of runs).",
        show_default=False,
    ),
]
PlotOption = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="The plot's file (PNG); default RESULTS/compare.png."),
]
TargetOption = Annotated[
    float | None,
    typer.Option(
        "--target",
        help="The return for 'time to target' (default: each run's own, from its "
        "experiment file's stop or its playbook's --target-return).",
    ),
]


def compare_cmd(
    runs: RunsArgument,
    results: ResultsOption = Path("results"),
    plot: PlotOption = None,
    target: TargetOption = None,
    json_: JsonOption = False,
) -> None:
    """Compare runs: mean return against env steps and wall time (a 95% band over the
    seeds of one config) in a plot, and a table of final return, time to target, env
    steps/s and node-hours."""
    from provisioner.jobs.compare import compare_runs
    from provisioner.jobs.plots import compare_plot

    out = output(json_)
    found = compare_runs(runs, results, target)
    drawn = compare_plot(found, plot if plot is not None else results / "compare.png")
    if json_:
        out.emit({**found.to_json(), "plot": str(drawn)})
        return
    table = Table("runs (seeds)", "final return", "time to target", "env steps/s", "node-hours")
    for g in found.groups:
        if g.target is None:
            to_target = "-"
        elif g.time_to_target is None:
            to_target = f"not reached ({g.target:g})"
        else:
            to_target = (
                f"{g.time_to_target.text(0)} s ({g.reached}/{len(g.curves)} reached {g.target:g})"
            )
        table.add_row(
            f"{g.label} ({len(g.curves)})",
            g.final_return.text(1) if g.final_return else "-",
            to_target,
            g.steps_per_s.text(0) if g.steps_per_s else "-",
            f"{g.node_hours:.4f}" if g.node_hours is not None else "-",
        )
    out.out.print(table)
    out.say("± : the half-width of the 95% interval of the mean over seeds (Student's t)")
    out.say(f"plot: {drawn}")


SourceArgument = Annotated[
    str,
    typer.Argument(
        help="A job whose results are home under --results, or a folder holding a checkpoint.",
        metavar="JOB|PATH",
        show_default=False,
    ),
]


def eval_cmd(
    source: SourceArgument,
    inventory: Annotated[
        Path | None,
        typer.Option(
            "-i",
            "--inventory",
            help="Inventory file (provisioner YAML, Ansible INI/YAML).",
            envvar="PROVISIONER_INVENTORY",
        ),
    ] = None,
    episodes: Annotated[
        int, typer.Option("--episodes", "-n", help="Episodes run on the cluster's env runners.")
    ] = 20,
    video: Annotated[
        int, typer.Option("--video", help="Episodes recorded as MP4 (rgb_array, headless).")
    ] = 0,
    results: ResultsOption = Path("results"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Ray's noise too.")] = False,
    json_: JsonOption = False,
) -> None:
    """Evaluate a trained checkpoint on the cluster: restore it with RLlib's
    Algorithm.from_checkpoint, run N episodes without exploration on its env runners and
    record K more as MP4; per-episode returns with mean, std and a 95% interval, and the
    videos, home in RESULTS/JOB/eval-*/. JOB: its latest checkpoint (of its best trial)."""
    from provisioner.cli.jobs import make_handlers, say_figures, show_outcome
    from provisioner.jobs.place import (
        Cluster,
        check_counts,
        evaluate,
        find_checkpoint,
        read_eval,
        target_for,
    )

    out = output(json_)
    check_counts(episodes, video)
    found = find_checkpoint(source, results)  # bad input before any connection
    target = target_for(inventory, None, None)
    handlers = make_handlers(out, json_, verbose)
    outcome = evaluate(target, found, episodes, video, handlers)
    place = Cluster(target, found.home, handlers)
    figures = read_eval(outcome.results.directory)
    if json_:
        out.emit({**outcome.to_json(), "eval": figures})
        if not outcome.ok:
            raise typer.Exit(1)
        return
    if figures is not None:
        say_figures(out, figures, outcome.results.directory)
    show_outcome(out, json_, place, outcome)
