"""`make demo`: from nothing to a trained policy on a 3-node cluster, and back to nothing.

    .venv/bin/python scripts/demo.py [--keep] [--nodes 3] [-- PLAYBOOK ARGS]

Runs, with each command shown before it runs and its progress as it goes:

    provisioner lab up --nodes 3 --name demo --subnet 10.250.50.0/24 --image-lock ...
    provisioner image build
    provisioner up -i INVENTORY                 (doctor, push the pin, start Ray, verify)
    provisioner submit -i INVENTORY playbooks/ppo_cartpole.py -- <small budget>
    (the training table, the summary, where the plots and TensorBoard events are)
    provisioner down -i INVENTORY               (skipped with --keep)
    provisioner lab down --name demo            (skipped with --keep)

and the time of each step and in all. By default nothing is left running (the lab's
three nodes hold ~6 GB of images); --keep leaves the cluster up to try more on it. On a
failure the demo stops there and leaves the lab up to look at (the commands to inspect
and remove it are printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from provisioner.cli.jobs import csv_table

ROOT = Path(__file__).resolve().parents[1]
PROVISIONER = str(Path(sys.executable).parent / "provisioner")
PLAYBOOK = Path("playbooks") / "ppo_cartpole.py"
# Small enough to finish in a few minutes on two cores shared by three nodes; CartPole's
# return climbs from ~20 to a few hundred within it. Env runners: one per CPU but the driver's.
BUDGET = ["--target-return", "300", "--max-env-steps", "25000", "--train-batch", "1000"]

console = Console(stderr=True, highlight=False)


@dataclass
class Demo:
    """The steps run so far and their times."""

    steps: list[tuple[str, float]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def run(self, title: str, *args: str, capture: bool = False) -> str:
        """Run one provisioner command, show it, time it; stop the demo if it fails."""
        number = len(self.steps) + 1
        console.rule(f"[bold]{number}. {title}")
        console.print(f"[bold cyan]$ provisioner {' '.join(args)}[/bold cyan]")
        t0 = time.monotonic()
        code, stdout = command([PROVISIONER, *args], capture)
        took = time.monotonic() - t0
        self.steps.append((title, took))
        if code != 0:
            raise StepFailed(title, code)
        console.print(f"[green]{title}: done in {took:.0f}s[/green]")
        return stdout

    def times(self) -> Table:
        table = Table("step", "time", title="demo")
        for title, took in self.steps:
            table.add_row(title, f"{took:6.1f}s")
        table.add_row("[bold]total[/bold]", f"[bold]{time.monotonic() - self.started:6.1f}s[/bold]")
        return table


def command(argv: list[str], capture: bool) -> tuple[int, str]:
    """Run argv in the repository; on Ctrl-C, let it finish its own way (it got the
    SIGINT too: `submit` stops the job, `up` its nodes' work) before giving up."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE if capture else None, text=True)
    try:
        stdout, _ = proc.communicate()
    except KeyboardInterrupt:
        try:
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        raise
    return proc.returncode, stdout or ""


class StepFailed(Exception):
    def __init__(self, title: str, code: int) -> None:
        super().__init__(f"{title} failed (exit {code})")
        self.code = code


def show_results(job: dict[str, Any]) -> None:
    """The training table, the summary line and where the plots are."""
    out = Console(highlight=False)
    directory = ROOT / job["results_dir"]
    if (directory / "metrics.csv").is_file():
        out.print(csv_table(directory / "metrics.csv", "training"))
    summary = job.get("summary") or {}
    if summary:
        out.print(
            f"mean return {summary['first_return_mean']:.1f} -> "
            f"{summary['episode_return_mean']:.1f} in {summary['env_steps']} env steps "
            f"({summary['time_s']:.0f}s, stopped by {summary['stopped_by']}); "
            f"{summary['env_runners']} env runners on nodes {', '.join(summary['nodes'])}"
        )
    out.print(f"results:     {directory}")
    for plot in job.get("plots", []):
        out.print(f"plot:        {ROOT / plot}")
    out.print(f"tensorboard: tensorboard --logdir {directory / 'tensorboard'}")


def main(argv: list[str]) -> int:
    own, playbook_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = argparse.ArgumentParser(description="make demo: lab up, image build, up, train, down")
    p.add_argument(
        "--keep", action="store_true", help="leave the cluster and the lab running at the end"
    )
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--name", default="demo", help="lab name")
    p.add_argument("--subnet", default="10.250.50.0/24", help="lab subnet")
    args = p.parse_args(own)
    demo = Demo()
    lock = Path("images") / "image.lock.json"  # commands run in the repository's root
    inventory = ""
    try:
        lab = json.loads(
            demo.run(
                f"lab up: {args.nodes} nodes",
                *("lab", "up", "--nodes", str(args.nodes), "--name", args.name),
                *("--subnet", args.subnet, "--image-lock", str(lock), "--json"),
                capture=True,
            )
        )
        inventory = lab["inventory"]
        demo.run("image build", "image", "build")
        demo.run("up: doctor, push the pin, start Ray", "up", "-i", inventory)
        job = json.loads(
            demo.run(
                "submit: PPO on CartPole-v1",
                *("submit", "-i", inventory, "--results", "results", "--json"),
                *(str(PLAYBOOK), "--"),
                *(playbook_args or BUDGET),
                capture=True,
            )
        )
        console.rule("[bold]results")
        show_results(job)
        if args.keep:
            show_kept(inventory, args.name)
        else:
            demo.run("down: logs home, Ray stopped", "down", "-i", inventory)
            demo.run("lab down", "lab", "down", "--name", args.name)
    except (StepFailed, KeyboardInterrupt) as exc:
        console.print(f"[bold red]demo stopped: {exc or 'interrupted'}[/bold red]")
        console.print(demo.times())
        if inventory:
            console.print(f"the lab is left up to look at: provisioner logs -i {inventory}")
        console.print(f"remove it with: provisioner lab down --name {args.name}")
        return exc.code if isinstance(exc, StepFailed) else 130
    Console(highlight=False).print(demo.times())
    return 0


def show_kept(inventory: str, name: str) -> None:
    """What to try on the cluster --keep left running, and how to remove it."""
    console.print(f"[bold]cluster and lab {name} kept running; try:[/bold]")
    for line in (
        f"provisioner status -i {inventory}",
        f"provisioner submit -i {inventory} playbooks/ppo_cells.py -- --max-env-steps 20000",
        f"provisioner tunnel -i {inventory}",
        f"provisioner down -i {inventory} && provisioner lab down --name {name}",
    ):
        console.print(f"  {line}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
