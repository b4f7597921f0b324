"""`make bench`: every benchmark side by side with the tool users would otherwise use.

    .venv/bin/python scripts/bench.py [--rows bring-up,fan-out,latency,push,training]
        [--repeat 3] [--endpoints 100] [--delays 0,50,100] [--small-image MB] [--out DIR]

One run on one lab (made here unless it exists: --lab, --subnet), each figure repeated
(--repeat; the 1.9 GB push --push-repeat) with the median and the spread (min-max).
Writes DIR/bench.md (a Markdown table: what was measured, on what, how to re-run it)
and DIR/bench.json, both with the machine's cores and memory. Figures on a shared
machine are noisy: every comparison is a ratio of runs made side by side.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_doctor
import bench_experiments
import bench_link
import bench_project
import bench_push
import bench_scale
import bench_scaling
import bench_ssh_latency
import bench_tls
import bench_up
from bench_repeats import Attempt, Repeats, summary

from provisioner.errors import InputError
from provisioner.image.pin import CLUSTER_TAG, Pin, read_pin
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabConfig, LabNode
from provisioner.lab.nodes import LabInfo, lab_down, lab_up, load_config
from provisioner.runtime.docker.push import PushOptions, push_image

ROOT = Path(__file__).resolve().parents[1]
GROUPS = (
    "bring-up", "fan-out", "latency", "ssh", "push", "link", "training", "tls", "project",
    "experiments", "sweeps", "scale"
)  # fmt: skip
DEFAULT_GROUPS = GROUPS[:-1]  # scale makes labs of its own (minutes, GBs): `--rows all`
SCRIPT = ".venv/bin/python scripts/bench.py"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- figures ---------------------------------------------------------------------------


@dataclass
class Figure:
    """One measured quantity over its repeats."""

    label: str
    unit: str
    runs: list[float]
    failures: list[Attempt] = field(default_factory=list)  # failed attempts, retries included
    repeats: int = 0  # repeats tried (0: as many as runs)
    retries: int = 0

    @property
    def median(self) -> float:
        """The median run; NaN when every repeat failed (ratios of it are None)."""
        return statistics.median(self.runs) if self.runs else math.nan

    def to_json(self) -> dict[str, Any]:
        some = bool(self.runs)
        return {
            "label": self.label,
            "unit": self.unit,
            "runs": [round(x, 3) for x in self.runs],
            "median": round(self.median, 3) if some else None,
            "min": round(min(self.runs), 3) if some else None,
            "max": round(max(self.runs), 3) if some else None,
            "repeats": self.repeats or len(self.runs),
            "failed": summary(self.failures, self.repeats or len(self.runs), self.retries),
            "failures": [a.to_json() for a in self.failures],
        }


def ratio(a: Figure, b: Figure | float) -> float | None:
    """a's median over b's (or over a number); None when either has no run."""
    den = b.median if isinstance(b, Figure) else b
    if math.isnan(a.median) or math.isnan(den) or den == 0:
        return None
    return a.median / den


def meets(value: float | None, test: Callable[[float], bool]) -> bool | None:
    return None if value is None else test(value)


def _bytes(x: float) -> str:
    return f"{x / 1e9:.2f} GB" if x >= 1e9 else f"{x / 1e6:.1f} MB" if x >= 1e5 else f"{x:.0f} B"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


@dataclass
class Row:
    group: str
    benchmark: str
    ours: Figure
    baseline: Figure | None
    ratio: float | None
    ratio_text: str  # how to read the ratio
    target: str
    met: bool | None
    what: str  # what was measured, on what
    extra: dict[str, Any] = field(default_factory=dict)
    id: str = ""  # a stable name for the row (bench.json's rows[].id)
    # a plain figure instead of a ratio (bench.json's rows[].value, in value_unit); ratio
    # is then None and ratio_text says what the value is
    value: float | None = None
    value_unit: str = ""

    @property
    def rerun(self) -> str:
        return f"{SCRIPT} --rows {self.group}"

    def to_json(self) -> dict[str, Any]:
        plain = (
            {"value": None if self.value is None else round(self.value, 3),
             "value_unit": self.value_unit}
            if self.value_unit
            else {}
        )  # fmt: skip
        return {
            **({"id": self.id} if self.id else {}),
            "group": self.group,
            "benchmark": self.benchmark,
            "ours": self.ours.to_json(),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            **plain,
            "ratio_is": self.ratio_text,
            "target": self.target,
            "met": self.met,
            "what": self.what,
            "rerun": self.rerun,
            **({"extra": self.extra} if self.extra else {}),
        }


# --- the machine and the markdown ------------------------------------------------------


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(total_kb / 1024 / 1024, 1),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def cell(figure: dict[str, Any] | None) -> str:
    """One figure of bench.json as a table cell: label: median (min–max)."""
    if figure is None:
        return "—"
    unit = figure["unit"]
    show = _bytes if unit == "B" else lambda x: f"{_num(x)} {unit}"
    if figure["median"] is None:
        text = f"{figure['label']}: failed every repeat"
    else:
        text = f"{figure['label']}: {show(figure['median'])}"
        if len(figure["runs"]) > 1:
            text += f" ({show(figure['min'])}–{show(figure['max'])})"
    if figure.get("failed"):
        text += f" · {figure['failed']}"
    return text


def failures_section(rows: list[dict[str, Any]]) -> list[str]:
    """Every failed attempt of the run, with its error (empty when none failed)."""
    lines: list[str] = []
    for r in rows:
        for fig in (r["ours"], r["baseline"]):
            for a in (fig or {}).get("failures", []):
                key = (r["benchmark"], fig["label"], a["repeat"], a["attempt"])
                line = (
                    f"- {key[0]} · {key[1]} · repeat {key[2]}, attempt {key[3]}: "
                    f"{a['error'][-400:]}"
                )
                if line not in lines:
                    lines.append(line)
    return (
        ["", "Failed attempts (recorded, retried, never stopping the run):", "", *lines]
        if lines
        else []
    )


def run_line(doc: dict[str, Any]) -> str:
    """One run's header: when, the command, the machine, its load, the lab, the repeats."""
    m = doc["machine"]
    return (
        f"{doc['finished']} · `{doc['command']}` · {m['cores']} cores ({m['cpu']}), "
        f"{m['memory_gib']} GiB memory, load average at start "
        f"{', '.join(str(x) for x in m['load_average_at_start'])} · lab: "
        f"{doc['lab_nodes']} nodes (containers with sshd and dockerd on this machine) · "
        f"repeats: {doc['repeat']} (push: {doc['push_repeat']}); "
        "figures are the median (min–max)."
    )


def markdown(doc: dict[str, Any]) -> str:
    """bench.md from bench.json's document: one run's, or several runs' rows merged
    (`scripts/bench_merge.py`: `runs`, and each row's `run`, an index into it)."""
    runs = doc.get("runs")
    if runs:
        head = [f"Run {i + 1}: {run_line(r)}" for i, r in enumerate(runs)]
        head = [line for pair in zip(head, [""] * len(head), strict=True) for line in pair][:-1]
    else:
        head = [run_line(doc)]
    lines = [
        "# Benchmarks",
        "",
        *head,
        "",
        "| Benchmark | provisioner | Baseline | Ratio | Target | Met | What, on what | Re-run |"
        + (" Run |" if runs else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if runs else ""),
    ]
    for r in doc["rows"]:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f} ({r['ratio_is']})"
        if r.get("value_unit"):  # a plain figure
            shown = "—" if r["value"] is None else f"{r['value']:.2f} {r['value_unit']}"
            ratio = f"{shown} ({r['ratio_is']})"
        met = "—" if r["met"] is None else ("yes" if r["met"] else "**no**")
        cells = [r["benchmark"], cell(r["ours"]), cell(r["baseline"]), ratio, r["target"], met]
        cells += [r["what"], f"`{r['rerun']}`"]
        if runs:
            cells.append(str(r.get("run", 0) + 1))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += failures_section(doc["rows"])
    lines += ["", "Everything: `make bench` (options: `" + SCRIPT + " --help`).", ""]
    return "\n".join(lines)


# --- the rows ---------------------------------------------------------------------------


@dataclass
class Context:
    lab: LabInfo
    pin_path: Path
    args: argparse.Namespace
    workdir: Path
    rep: Repeats = field(default_factory=Repeats)

    def fig(self, label: str, unit: str, key: str, runs: list[float | None]) -> Figure:
        """A figure of the repeats run under `key` (None: a repeat that failed for good)."""
        return Figure(
            label,
            unit,
            [x for x in runs if x is not None],
            self.rep.of(key),
            len(runs),
            self.rep.retries,
        )

    @property
    def inventory(self) -> Path:
        return self.lab.inventory

    def pin(self) -> Pin:
        return read_pin(self.pin_path)

    def ensure_pin(self) -> None:
        """Every node holds the pin under the cluster tag (seconds when it does already)."""
        inv = load_inventory(self.inventory)
        report = push_image(inv, None, pin=self.pin(), opts=PushOptions())
        if not report.ok:
            raise SystemExit(f"cannot push the pin to the lab: {report.errors}")

    def down(self) -> None:
        bench_up.down(str(self.inventory))
        bench_up.forget_launcher_state(load_inventory(self.inventory))


def rows_bring_up(ctx: Context) -> list[Row]:
    ours, theirs = bench_up.side_by_side(
        ctx.inventory, ctx.args.repeat, ctx.args.limit, guard=ctx.rep.run
    )
    n = len(ctx.lab.nodes)

    def fig(label: str, runs: list[bench_up.Timing | None], key: str) -> Figure:
        tool = "up" if label.startswith("provisioner") else "ray up"
        values = [None if t is None else float(getattr(t, key)) for t in runs]
        return ctx.fig(label, "s", f"bring-up/{tool}", values)

    alive_a, alive_b = fig("provisioner up", ours, "alive"), fig("ray up", theirs, "alive")
    ready_a, ready_b = fig("provisioner up", ours, "ready"), fig("ray up", theirs, "ready")
    ray_a, ray_b = fig("provisioner up", ours, "ray_start"), fig("ray up", theirs, "ray_start")
    floor = ratio(ray_a, alive_b)
    r_alive = ratio(alive_a, alive_b)

    def added(t: bench_up.Timing | None) -> float | None:  # up's part of one run
        return None if t is None or not math.isfinite(t.alive) else t.alive - t.ray_start

    adds = ctx.fig("what `up` adds", "s", "bring-up/up", [added(t) for t in ours])
    add = None if math.isnan(adds.median) else adds.median
    own = Figure("Ray's own start under `up`", "s", ray_a.runs, ray_a.failures, ray_a.repeats,
                 ray_a.retries)  # fmt: skip
    same = (
        f"`provisioner up` vs `ray up` of the file `provisioner render` wrote, same {n}-node "
        "lab, image present on every node, all down between runs"
    )
    return [
        Row(
            "bring-up",
            f"bring-up, {n} nodes: until every node is alive",
            alive_a,
            alive_b,
            r_alive,
            "up / ray up",
            "≤ 0.33",
            meets(r_alive, lambda r: r <= 1 / 3),
            f"{same}; from the command's start until the last node registered alive, by the "
            "GCS's own registration times (no polling cost to either)",
            {"floor_ratio": None if floor is None else round(floor, 3)},
        ),
        Row(
            "bring-up",
            f"bring-up, {n} nodes: until the command is done and every node alive",
            ready_a,
            ready_b,
            ratio(ready_a, ready_b),
            "up / ray up",
            "—",
            None,
            f"{same}; `provisioner up` returns after its placement probe ran a task on every "
            "node; `ray up` returns before its workers join, so its figure is the later of "
            "its return and the last node alive",
        ),
        Row(
            "bring-up",
            f"bring-up, {n} nodes: Ray's own start",
            ray_a,
            ray_b,
            ratio(ray_a, ray_b),
            "up / ray up",
            "—",
            None,
            f"{same}; from the head container's start until the last node registered: Ray "
            "starting itself, which no launcher shortens. Divided by `ray up`'s time to every "
            "node alive it gives the best ratio any launcher could reach here: "
            + ("—" if floor is None else f"{floor:.2f}"),
            {"floor_ratio": None if floor is None else round(floor, 3)},
        ),
        Row(
            "bring-up",
            f"bring-up, {n} nodes: what `up` adds to Ray's own start",
            adds,
            own,
            None,
            "s that `up` adds: its time to every node alive less Ray's own start, per run",
            "≤ 1.0 s",
            meets(add, lambda v: v <= 1.0),
            f"{same}; each run of `provisioner up`: from the command's start until the last "
            "node registered alive, less Ray's own part of it (the head container's start "
            "to the last node registered): the doctor, the image check, the token, the old "
            "containers' removal and the start commands, Python's own start included",
            id="up-overhead-s",
            value=add,
            value_unit="s",
        ),
    ]


def rows_fan_out(ctx: Context) -> list[Row]:
    n, par = ctx.args.endpoints, ctx.args.parallel or ctx.args.endpoints
    k = ctx.args.repeat
    with bench_doctor.endpoints(ctx.lab, n, ctx.workdir / "endpoints") as eps:
        ssh_runs: list[float | None] = []
        doctor_runs: list[float | None] = []
        facts_runs: list[float | None] = []
        ansible_runs: list[float | None] = []
        facts_cpu: list[float | None] = []
        ansible_cpu: list[float | None] = []
        floor_runs: list[float | None] = []
        ssh_facts_runs: list[float | None] = []
        facts_node: list[float | None] = []  # the endpoints' node's CPU seconds
        floor_node: list[float | None] = []
        ssh_ms: list[float | None] = []  # node CPU ms, one at a time
        facts_ms: list[float | None] = []
        run = ctx.rep.run
        for i in range(k):  # interleaved, so a busy moment hits every tool alike
            log(f"fan-out {i + 1}/{k}: ssh true, doctor, its facts, Ansible, floor, ssh facts")
            ssh_runs.append(run("fan-out/ssh", lambda: bench_doctor.openssh_fan_out(eps, par)))
            doctor_runs.append(
                run(
                    "fan-out/doctor",
                    lambda: bench_doctor.doctor_fan_out(eps, par, reachability=True),
                )
            )
            found = run(
                "fan-out/facts",
                lambda: bench_doctor.on_node(
                    eps,
                    lambda: with_cpu(
                        lambda: bench_doctor.doctor_fan_out(eps, par, reachability=False)
                    ),
                ),
            )
            facts_runs.append(None if found is None else found[0][0])
            facts_cpu.append(None if found is None else found[0][1])
            facts_node.append(None if found is None else found[1])
            pair = run(
                "fan-out/ansible", lambda: with_cpu(lambda: bench_doctor.ansible_fan_out(eps, par))
            )
            ansible_runs.append(None if pair is None else pair[0])
            ansible_cpu.append(None if pair is None else pair[1])
            floored = run(
                "fan-out/floor",
                lambda: bench_doctor.on_node(eps, lambda: bench_doctor.facts_floor(eps, par)),
            )
            floor_runs.append(None if floored is None else floored[0])
            floor_node.append(None if floored is None else floored[1])
            serial = run("fan-out/serial", lambda: bench_doctor.node_cost_serial(eps))
            ssh_ms.append(None if serial is None else serial["ssh_ms"])
            facts_ms.append(None if serial is None else serial["facts_ms"])
            ssh_facts_runs.append(
                run("fan-out/ssh-facts", lambda: bench_doctor.openssh_facts_fan_out(eps, par))
            )
    ssh = ctx.fig("`ssh HOST true`", "s", "fan-out/ssh", ssh_runs)
    doctor = ctx.fig("doctor", "s", "fan-out/doctor", doctor_runs)
    facts = ctx.fig("doctor, facts only", "s", "fan-out/facts", facts_runs)
    ansible = ctx.fig("ansible -m script facts.sh", "s", "fan-out/ansible", ansible_runs)
    floor = ctx.fig("facts.sh alone", "s", "fan-out/floor", floor_runs)
    ssh_facts = ctx.fig(
        "OpenSSH: ssh HOST bash -s < facts.sh", "s", "fan-out/ssh-facts", ssh_facts_runs
    )
    doctor_cpu = ctx.fig("doctor, facts only", "CPU s", "fan-out/facts", facts_cpu)
    doctor_node = ctx.fig("doctor, facts only", "CPU s", "fan-out/facts", facts_node)
    floor_node_fig = ctx.fig("facts.sh alone", "CPU s", "fan-out/floor", floor_node)
    sshd = ctx.fig("an SSH connection and one command", "CPU ms", "fan-out/serial", ssh_ms)
    script_alone = ctx.fig("one facts.sh, no SSH", "CPU ms", "fan-out/serial", facts_ms)
    bound = (
        None
        if sshd.median is None or script_alone.median is None
        else ((sshd.median + script_alone.median) / script_alone.median)
    )
    ansible_cpu_fig = ctx.fig("ansible -m script facts.sh", "CPU s", "fan-out/ansible", ansible_cpu)
    on = (
        f"{n} SSH endpoints (sshd ports on one lab node), parallelism {par} for every tool; "
        "first connection each run (no reuse)"
    )
    r1 = ratio(doctor, ssh)
    r2 = ratio(ansible, facts)
    r3 = ratio(facts, floor)
    paired = [  # each repeat's own ratio: its two runs were made one after the other
        round(a / b, 3)
        for a, b in zip(facts_runs, floor_runs, strict=True)
        if a is not None and b is not None and b > 0
    ]
    return [
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: doctor vs OpenSSH",
            doctor,
            ssh,
            r1,
            "doctor / ssh",
            "≤ 2",
            meets(r1, lambda r: r <= 2),
            f"`provisioner doctor` (facts, port listeners, reachability probes) vs OpenSSH "
            f"`ssh HOST true` to every endpoint; {on}",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: doctor vs Ansible",
            facts,
            ansible,
            r2,
            "Ansible / doctor",
            "≥ 5",
            meets(r2, lambda r: r >= 5),
            "the same facts both ways: the doctor's facts round vs Ansible's ad-hoc "
            f"`ansible all -f {par} -m script` running the doctor's own facts.sh (ansible-core, "
            f"its default SSH connection with ControlPersist, no pty); {on}. Both wait for "
            "the same 100 runs of facts.sh on the endpoints' shared CPUs",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: doctor's facts round vs facts.sh alone",
            facts,
            floor,
            r3,
            "doctor facts round / facts.sh alone",
            "≤ 1.3",
            meets(r3, lambda r: r <= 1.3),
            f"the doctor's facts round (no reachability listener: one SSH session and one "
            f"facts.sh per endpoint, parsed) vs facts.sh run {n} times, {par} at a time, on "
            "the endpoints' lab node itself without SSH (its floor: the same work, no SSH, "
            f"no parse); {on}",
            {"paired_ratios": paired},
            id="doctor-facts-vs-floor",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: doctor's facts round vs OpenSSH running facts.sh",
            facts,
            ssh_facts,
            ratio(facts, ssh_facts),
            "doctor facts round / OpenSSH",
            "—",
            None,
            f"the reference for the row above: the same facts.sh, with the same arguments, "
            f"run on every endpoint through OpenSSH's own client (`ssh HOST bash -s -- ARGS < "
            f"facts.sh`, the doctor's command line), {par} at a time: facts.sh and SSH and "
            f"nothing of provisioner's; {on}",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: the node's CPU, doctor's facts round vs facts.sh alone",
            doctor_node,
            floor_node_fig,
            ratio(doctor_node, floor_node_fig),
            "doctor facts round / facts.sh alone",
            "—",
            None,
            "CPU seconds the endpoints' lab node spent (its container's cgroup: sshd, the "
            "shells, facts.sh) during each run of the row above: the SSH side's own cost on "
            f"the node, which shares this machine's cores with the doctor; {on}",
        ),
        Row(
            "fan-out",
            "SSH's cost on the node against facts.sh's, one at a time",
            sshd,
            script_alone,
            bound,
            "(SSH + facts.sh) / facts.sh: the least any SSH client's round can be of the floor",
            "—",
            None,
            "node CPU milliseconds without contention: an SSH connection and one command "
            "(`true`) as the doctor makes them (sshd: its re-exec, key exchange, "
            "authentication, PAM, the login shell), 30 one after the other, against one run "
            "of facts.sh without SSH, 30 one after the other (scripts/bench_doctor.py, "
            "`node_cost_serial`)",
            id="doctor-ssh-bound",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: facts.sh alone vs Ansible",
            floor,
            ansible,
            ratio(ansible, floor),
            "Ansible / facts.sh alone",
            "—",
            None,
            f"facts.sh run {n} times, {par} at a time, on the endpoints' lab node itself, no "
            "SSH: the work any tool gathering these facts waits for on this machine. The "
            "ratio is the most any tool could be faster than Ansible here",
        ),
        Row(
            "fan-out",
            f"fan-out, {n} endpoints: control-machine CPU, doctor vs Ansible",
            doctor_cpu,
            ansible_cpu_fig,
            ratio(ansible_cpu_fig, doctor_cpu),
            "Ansible / doctor",
            "—",
            None,
            "CPU seconds spent on the control machine by each tool in the row above (the "
            "process and the children it waited for: ssh, ansible's forks; not Ansible's "
            "ControlPersist masters, which detach): what each tool costs by itself, apart "
            "from the work on the endpoints",
        ),
    ]


def with_cpu(fn: Callable[[], float]) -> tuple[float, float]:
    """fn's result and the CPU seconds this process and its waited-for children spent."""

    def used() -> float:
        return sum(
            r.ru_utime + r.ru_stime
            for r in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        )

    start = used()
    value = fn()
    return value, used() - start


def ssh_true_lab(lab: LabInfo) -> float:
    """Seconds for OpenSSH `ssh NODE true` to every lab node at once."""

    def one(node: LabNode) -> int:
        cmd = [*lab.ssh_command(node), "true"]
        return subprocess.run(cmd, capture_output=True, check=False).returncode

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(lab.nodes)) as pool:
        codes = list(pool.map(one, lab.nodes))
    if any(codes):
        raise SystemExit(f"ssh to the lab failed: exit codes {codes}")
    return time.monotonic() - t0


def delayed(lab: LabInfo, ms: int, fn: Callable[[], float]) -> float:
    if ms:
        for node in lab.nodes:
            faults.delay(lab, node, ms)
    try:
        return fn()
    finally:
        if ms:
            for node in lab.nodes:
                faults.undelay(lab, node)


def rtts(a: Figure, b: Figure, rtt: float) -> float | None:
    """a's median minus b's, in round-trip times; None when either has no run."""
    gap = (a.median - b.median) / rtt
    return None if math.isnan(gap) else gap


def rows_latency(ctx: Context) -> list[Row]:
    lab, k, delays = ctx.lab, ctx.args.repeat, ctx.args.delays
    n = len(lab.nodes)
    ctx.down()
    info = bench_doctor.lab_doctor(lab, 32)
    checks, rounds = int(str(info["checks_per_node"])), int(str(info["round_trips_per_node"]))
    doctor: dict[int, list[float | None]] = {}
    ssh: dict[int, list[float | None]] = {}
    up: dict[int, list[float | None]] = {}
    run = ctx.rep.run
    inv = load_inventory(ctx.inventory)

    def doctor_once() -> float:
        t0 = time.monotonic()
        bench_doctor.lab_doctor(lab, 32)
        return time.monotonic() - t0

    def up_after_down() -> float:
        ctx.down()
        return bench_up.provisioner_up(ctx.inventory, inv, ctx.args.limit).ready

    for ms in delays:
        log(f"latency +{ms} ms: ssh true, doctor x{k}; up x{ctx.args.up_repeat}")
        ssh_at = functools.partial(delayed, lab, ms, lambda: ssh_true_lab(lab))
        doctor_at = functools.partial(delayed, lab, ms, doctor_once)
        down_up = functools.partial(delayed, lab, ms, up_after_down)
        ssh[ms] = [run(f"latency/ssh/{ms}", ssh_at) for _ in range(k)]
        doctor[ms] = [run(f"latency/doctor/{ms}", doctor_at) for _ in range(k)]
        runs = [run(f"latency/up/{ms}", down_up) for _ in range(ctx.args.up_repeat)]
        run("latency/down", ctx.down)
        up[ms] = runs
    how = (
        "added round-trip time on every node's SSH link: this kernel has no sch_netem, so "
        "`provisioner lab fault delay` puts a delaying proxy in front of each node's sshd "
        "(Ray's own traffic between nodes is not delayed)"
    )
    rows: list[Row] = []
    zero = delays[0]
    for ms in delays:
        names = ("doctor", "ssh", "up")
        d0, s0, u0 = (
            ctx.fig(f"+{zero} ms", "s", f"latency/{t}/{zero}", x[zero])
            for t, x in zip(names, (doctor, ssh, up), strict=True)
        )
        d, s, u = (
            ctx.fig(f"+{ms} ms", "s", f"latency/{t}/{ms}", x[ms])
            for t, x in zip(names, (doctor, ssh, up), strict=True)
        )
        if ms == zero:
            rows.append(
                Row(
                    "latency",
                    f"latency: doctor, {n} nodes, +{ms} ms",
                    d,
                    s,
                    ratio(d, s),
                    "doctor / ssh true",
                    "—",
                    None,
                    f"`provisioner doctor` on the {n}-node lab vs OpenSSH `ssh NODE true` to the "
                    f"same nodes, no added delay; {rounds} rounds, {checks} checks per node",
                )
            )
            rows.append(
                Row(
                    "latency",
                    f"latency: up, {n} nodes, +{ms} ms",
                    u,
                    None,
                    None,
                    "",
                    "—",
                    None,
                    f"`provisioner up` on the {n}-node lab (image present, from down), no delay",
                )
            )
            continue
        rtt = ms / 1000

        d_rtts, s_rtts, u_rtts = (rtts(x, x0, rtt) for x, x0 in ((d, d0), (s, s0), (u, u0)))
        s_text = "—" if s_rtts is None else f"{s_rtts:.1f}"
        rows.append(
            Row(
                "latency",
                f"latency: doctor, {n} nodes, +{ms} ms",
                d,
                s,
                d_rtts,
                f"added time in RTTs; `ssh true` adds {s_text}",
                f"grows with its {rounds} rounds, not its {checks} checks per node",
                None if d_rtts is None or s_rtts is None else d_rtts - s_rtts < checks,
                f"{how}; doctor vs `ssh NODE true` at the same delay, both from a fresh "
                "connection: the doctor's extra RTTs over one SSH command are its rounds",
                {"added_s": round(d.median - d0.median, 3), "ssh_added_s": s.median - s0.median},
            )
        )
        rows.append(
            Row(
                "latency",
                f"latency: up, {n} nodes, +{ms} ms",
                u,
                u0,
                u_rtts,
                f"added time in RTTs (vs +{zero} ms)",
                "—",
                None,
                f"{how}; `provisioner up` from down until it returned with every node alive",
                {"added_s": round(u.median - u0.median, 3)},
            )
        )
    return rows


def rows_ssh(ctx: Context) -> list[Row]:
    k, each = ctx.args.repeat, 20
    found: dict[str, list[float | None]] = {}
    for i in range(k):
        log(f"ssh {i + 1}/{k}: a fresh connection's first command, then one on an open one")
        got = ctx.rep.run("ssh", lambda: bench_ssh_latency.measure(ctx.lab, each))
        for key in ("fresh_s", "openssh_fresh_s", "next_s", "openssh_next_s"):
            found.setdefault(key, []).append(None if got is None else got[key] * 1000)
    fresh = ctx.fig("provisioner", "ms", "ssh", found["fresh_s"])
    openssh_fresh = ctx.fig("`ssh NODE true`", "ms", "ssh", found["openssh_fresh_s"])
    again = ctx.fig("provisioner", "ms", "ssh", found["next_s"])
    muxed = ctx.fig("`ssh -S SOCKET NODE true`", "ms", "ssh", found["openssh_next_s"])
    on = (
        f"`true` on the lab's head node, one after the other; each repeat the median of "
        f"{each} (scripts/bench_ssh_latency.py)"
    )
    r_fresh, r_next = ratio(fresh, openssh_fresh), ratio(again, muxed)
    return [
        Row(
            "ssh",
            "SSH: a new connection and its first command",
            fresh,
            openssh_fresh,
            r_fresh,
            "provisioner / OpenSSH",
            "≤ 1",
            meets(r_fresh, lambda r: r <= 1),
            f"connect (TCP, key exchange, authentication) and run one command, vs OpenSSH's "
            f"`ssh NODE true`; {on}",
            id="ssh-command-fresh",
        ),
        Row(
            "ssh",
            "SSH: a command on an open connection",
            again,
            muxed,
            r_next,
            "provisioner / OpenSSH",
            "≤ 1",
            meets(r_next, lambda r: r <= 1),
            f"one more command on a connection already open (what every step after the "
            f"first costs), vs OpenSSH's own reuse of a connection through a ControlMaster "
            f"(`ssh -S SOCKET NODE true`, as Ansible runs); {on}",
            id="ssh-command-open",
        ),
    ]


def rows_push(ctx: Context) -> list[Row]:
    inv = load_inventory(ctx.inventory)
    pin = ctx.pin()
    small = ctx.args.small_image
    if small:
        pin = bench_push.small_pin(pin, small)
    tag = pin.tag if small else CLUSTER_TAG
    node = (inv.workers or (inv.head,))[0]
    tried: list[dict[str, Any] | None] = []
    for i in range(ctx.args.push_repeat):
        log(f"push {i + 1}/{ctx.args.push_repeat}: {pin.size / 1e6:.0f} MB image")
        tried.append(ctx.rep.run("push", lambda: bench_push.measure(inv, pin, node, tag=tag)))
    runs = [r for r in tried if r is not None]
    size = pin.size

    def fig(label: str, unit: str, value: Callable[[dict[str, Any]], float]) -> Figure:
        return ctx.fig(label, unit, "push", [None if r is None else value(r) for r in tried])

    ours = fig("push", "MB/s", lambda r: size / 1e6 / r["push_seconds"])
    base = fig("docker save | ssh docker load", "MB/s", lambda r: size / 1e6 / r["openssh_seconds"])
    through = ratio(ours, base)
    image = f"{size / 1e9:.2f} GB pin" if not small else f"{size / 1e6:.0f} MB test image"
    repush_bytes = fig("image bytes", "B", lambda r: float(r["repush_bytes"]))
    repush_s = fig("re-push", "s", lambda r: float(r["repush_seconds"]))
    direct = fig("direct", "B", lambda r: float(r["direct_control_bytes"]))
    relay = fig("relay", "B", lambda r: float(r["relay_control_bytes"]))
    n = len(inv.nodes)
    relay_ratio = ratio(relay, float(size))
    return [
        Row(
            "push",
            "push throughput, 1 node",
            ours,
            base,
            through,
            "push / OpenSSH",
            "≥ 0.9",
            meets(through, lambda r: r >= 0.9),
            f"`provisioner image push` of the {image} to one lab node that holds none of it vs "
            "`docker save IMAGE | ssh NODE docker load` through OpenSSH (image bytes / seconds)",
            {"runs": runs},
        ),
        Row(
            "push",
            "re-push, 1 node",
            repush_bytes,
            None,
            None,
            "",
            "0 image bytes",
            all(x == 0 for x in repush_bytes.runs) if repush_bytes.runs else None,
            f"the same push again to the node that now holds the {image}; took "
            f"{_num(repush_s.median)} s",
        ),
        Row(
            "push",
            f"control-machine bytes, {n} nodes",
            relay,
            direct,
            relay_ratio,
            "relay bytes / image size",
            "≈ 1 image (≤ 1.1)",
            meets(relay_ratio, lambda r: r <= 1.1),
            f"bytes sent from this machine pushing the {image} to {n} nodes holding none of "
            "it: with relay (the head forwards to the workers) vs direct",
        ),
    ]


def rows_link(ctx: Context) -> list[Row]:
    """The pin over a node's link limited to --link-mbit (the lab's delay proxy), and over
    the lab's own link: ours (cold and warm cache) against the plain and the gzip pipe."""
    assert ctx.lab is not None
    inv = load_inventory(ctx.inventory)
    pin = ctx.pin()
    if ctx.args.small_image:
        pin = bench_push.small_pin(pin, ctx.args.small_image)
    node = (inv.workers or (inv.head,))[0]
    cache = ctx.workdir / "link-cache"
    mb = pin.size / 1e6
    rows: list[Row] = []
    for rate in [*ctx.args.link_mbit, 0.0]:  # 0: the lab's own link, unlimited
        key = f"link/{rate:g}"
        tried: list[dict[str, Any] | None] = []
        for i in range(ctx.args.link_repeat):
            log(f"link {rate or 'lab'} Mbit/s, {i + 1}/{ctx.args.link_repeat}: {mb:.0f} MB")

            def once(rate: float = rate) -> dict[str, Any]:
                if rate:
                    faults.throttle(ctx.lab, ctx.lab.node(node.name), rate)
                try:
                    return bench_link.measure(inv, pin, node, cache, gzip=bool(rate))
                finally:
                    faults.undelay(ctx.lab, ctx.lab.node(node.name))

            tried.append(ctx.rep.run(key, once))
        runs = [r for r in tried if r is not None]

        def fig(
            label: str,
            value: Callable[[dict[str, Any]], float],
            key: str = key,
            tried: list[dict[str, Any] | None] = tried,
        ) -> Figure:
            return ctx.fig(label, "s", key, [None if r is None else value(r) for r in tried])

        pipe = fig("docker save | ssh | docker load", lambda r: r["pipe_s"])
        cold = fig("push, cold cache", lambda r: r["cold"]["seconds"])
        warm = fig("push, compressed layers cached", lambda r: r["warm"]["seconds"])
        codecs = sorted({f"{r[k]['codec'] or 'plain'}" for r in runs for k in ("cold", "warm")})
        why = [r[k]["why"] for r in runs for k in ("cold", "warm")]
        extra = {"runs": runs, "codecs": codecs, "reasons": why}
        where = f"the {mb / 1e3:.2f} GB pin to one lab node that holds none of it"
        if not rate:
            fast = ratio(pipe, cold)  # throughput ours / theirs = their seconds / ours
            rows.append(
                Row(
                    "link",
                    "push, lab link",
                    cold,
                    pipe,
                    fast,
                    "pipe seconds / push seconds",
                    "≥ 1.0",
                    meets(fast, lambda r: r >= 1.0),
                    f"{where} over the lab's own link (no limit), cold cache: the rule "
                    f"chose {', '.join(codecs)}; cached: {_num(warm.median)} s",
                    extra,
                    id="push-fast-vs-pipe",
                )
            )
            continue
        gz = fig("docker save | gzip -1 | ssh | gunzip | docker load", lambda r: r["gzip_pipe_s"])
        tag = f"{rate:g}mbit"
        vs_pipe, vs_gz = ratio(cold, pipe), ratio(cold, gz)
        vs_gz_warm = ratio(warm, gz)
        rows += [
            Row(
                "link",
                f"push at {rate:g} Mbit/s vs pipe",
                cold,
                pipe,
                vs_pipe,
                "push seconds / pipe seconds",
                "≤ 0.5",
                meets(vs_pipe, lambda r: r <= 0.5),
                f"{where} over a {rate:g} Mbit/s link (token bucket in the lab's SSH proxy), "
                f"cold cache (docker save and compression paid); codec {', '.join(codecs)}",
                extra,
                id=f"push-{tag}-vs-pipe",
            ),
            Row(
                "link",
                f"push at {rate:g} Mbit/s vs gzip pipe",
                cold,
                gz,
                vs_gz,
                "push seconds / gzip-pipe seconds",
                "≤ 0.8",
                meets(vs_gz, lambda r: r <= 0.8),
                "as above, against `gzip -1` and `gunzip` on the pipe",
                id=f"push-{tag}-vs-gzip-pipe",
            ),
            Row(
                "link",
                f"push at {rate:g} Mbit/s, cached, vs gzip pipe",
                warm,
                gz,
                vs_gz_warm,
                "push seconds / gzip-pipe seconds",
                "≤ 0.8",
                meets(vs_gz_warm, lambda r: r <= 0.8),
                "the same push again from this machine's cache of compressed layers (a second "
                "cluster's push: nothing compressed)",
                id=f"push-{tag}-cached-vs-gzip-pipe",
            ),
        ]
    return rows


def rows_training(ctx: Context) -> list[Row]:
    args = ctx.args
    subprocess.run(
        [sys.executable, "-m", "provisioner", "up", "-i", str(ctx.inventory)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    playbook = [
        "--max-env-steps",
        str(args.train_steps),
        "--train-batch",
        str(args.train_batch),
        "--target-return",
        "100000",
    ]
    try:
        rows = bench_scaling.measure(
            ctx.inventory,
            args.runners,
            playbook,
            ctx.workdir / "training",
            ctx.workdir / "training.log",
        )
    finally:
        ctx.down()
    one = next(r for r in rows if r["env_runners"] == 1)
    top = max(rows, key=lambda r: int(r["env_runners"]))
    a = Figure(f"{top['env_runners']} runners", "steps/s", [float(top["env_steps_per_s"])])
    b = Figure("1 runner", "steps/s", [float(one["env_steps_per_s"])])
    n = len(ctx.lab.nodes)
    return [
        Row(
            "training",
            f"training: env steps/s, 1 vs {top['env_runners']} env runners",
            a,
            b,
            ratio(a, b),
            f"speed-up with {top['env_runners']} runners",
            "—",
            None,
            f"PPO on CartPole (playbooks/scaling.py through `provisioner submit`), "
            f"{args.train_steps} env steps per count, batch {args.train_batch}, on the {n}-node "
            f"lab cluster (all nodes share this machine's {os.cpu_count()} cores)",
            {"table": rows},
        )
    ]


def rows_tls(ctx: Context) -> list[Row]:
    """PPO env steps/s with TLS on Ray's channels (the default) and off, same cluster."""
    args, work = ctx.args, ctx.workdir / "tls"
    work.mkdir(parents=True, exist_ok=True)
    inventories = {
        on: bench_tls.inventory_with_tls(ctx.inventory, work / f"tls-{on}.yaml", on=on)
        for on in (True, False)
    }
    runs: dict[bool, list[float | None]] = {True: [], False: []}
    try:
        for i in range(args.repeat):  # interleaved, so a busy moment hits both alike
            for on in (True, False) if i % 2 == 0 else (False, True):
                log(f"tls {i + 1}/{args.repeat}: PPO with TLS {'on' if on else 'off'}")
                runs[on].append(
                    ctx.rep.run(
                        f"tls/{'on' if on else 'off'}",
                        lambda on=on: bench_tls.steps_per_s(
                            inventories[on], args.runners, args.train_steps, args.train_batch,
                            work / "results", work / "tls.log",
                        ),
                    )
                )  # fmt: skip
    finally:
        bench_up.down(str(inventories[True]))
    a = ctx.fig("TLS on", "steps/s", "tls/on", runs[True])
    b = ctx.fig("TLS off", "steps/s", "tls/off", runs[False])
    kept = ratio(a, b)
    lost = None if kept is None else 1 - kept
    n = len(ctx.lab.nodes)
    return [
        Row(
            "tls",
            "PPO env steps/s: TLS on Ray's channels (the default) vs off",
            a,
            b,
            lost,
            "fraction of env steps/s lost to TLS",
            "≤ 0.10",
            meets(lost, lambda x: x <= 0.10),
            f"PPO on CartPole (playbooks/ppo_cartpole.py through `provisioner submit`), "
            f"{args.runners} env runners, {args.train_steps} env steps, batch "
            f"{args.train_batch}, on the {n}-node lab cluster, Ray restarted (down, up) with "
            f"`ray: {{tls: true}}` and `{{tls: false}}` in turn, interleaved",
            id="ppo-tls-cost",
        )
    ]


def rows_project(ctx: Context) -> list[Row]:
    """`image build --project` after a one-line change: its time, and the bytes its push
    sends to a node holding the build before, over the changed layer's size."""
    inv = load_inventory(ctx.inventory)
    node = bench_project.one_node(inv, (inv.workers or (inv.head,))[0])
    project = bench_project.copy_example(ctx.workdir)
    images = ctx.pin_path.parent
    tried: list[dict[str, Any] | None] = []
    try:
        for i in range(ctx.args.repeat):
            log(f"project {i + 1}/{ctx.args.repeat}: one line changed, rebuilt, pushed")
            tried.append(
                ctx.rep.run(
                    "project", lambda i=i: bench_project.measure(node, project, images, i + 1)
                )
            )
    finally:
        ctx.ensure_pin()  # the nodes' cluster tag back on the base pin
    runs = [r for r in tried if r is not None]

    def fig(label: str, unit: str, key: str) -> Figure:
        return ctx.fig(
            label, unit, "project", [None if r is None else float(r[key]) for r in tried]
        )

    rebuild = fig("rebuild", "s", "rebuild_seconds")
    sent = fig("bytes sent", "B", "bytes_sent")
    layer = fig("changed layer (its tar)", "B", "own_layer_tar_bytes")
    repush = ratio(sent, layer)
    only = all(r["only_last_layer_differs"] and r["layers_sent"] == 1 for r in runs)
    return [
        Row(
            "project",
            "project rebuild after a one-line change",
            rebuild,
            None,
            None,
            "seconds",
            "≤ 30 s",
            meets(rebuild.median, lambda s: s <= 30) if rebuild.runs else None,
            "`provisioner image build --project` of examples/gridcells (a copy) after one line "
            "of its environment changed, in a process of its own (pip builds the wheel, Docker "
            "the last layer on the cached ones); the base pin and the project lock unchanged"
            + ("; only the last layer differed" if only else ""),
            {"runs": runs},
            id="project-rebuild-s",
            value=rebuild.median if rebuild.runs else None,
            value_unit="s",
        ),
        Row(
            "project",
            "project re-push after a one-line change",
            sent,
            layer,
            repush,
            "bytes sent / the changed layer's tar",
            "≤ 1.1",
            meets(repush, lambda r: r <= 1.1),
            "`image push` of that build to one lab node holding the build before it: bytes "
            "sent from this machine over the size of the project's own (last) layer, as "
            "`docker save` writes it (the image's config and manifest travel too)"
            + (", one layer sent" if only else "")
            + (
                f"; the layer went {'/'.join(codecs)}-compressed (a send under 4 MB is, "
                "unmeasured; plain, this send was 32 KB: 1.34)"
                if (codecs := sorted({str(r.get("codec")) for r in runs if r.get("codec")}))
                else ""
            ),
            id="project-repush-ratio",
        ),
    ]


def up_with_log(ctx: Context, name: str) -> Path:
    """The lab cluster up (`provisioner up`), and an empty log file of the CLI runs in --out."""
    subprocess.run(
        [sys.executable, "-m", "provisioner", "up", "-i", str(ctx.inventory)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    ctx.args.out.mkdir(parents=True, exist_ok=True)
    log_file = ctx.args.out / name
    log_file.write_text("")
    return log_file


def rows_experiments(ctx: Context) -> list[Row]:
    """Issue 45's learning thresholds through the CLI: SAC on Pendulum reaches -400 or
    better; CartPole PPO's evaluation returns at least 0.9 of its training return."""
    log_file = up_with_log(ctx, "experiments.log")
    try:
        sac = ctx.rep.run(
            "sac", lambda: bench_experiments.sac_pendulum(ctx.inventory, ctx.workdir, log_file)
        )
        seeds = ctx.rep.run(
            "cartpole",
            lambda: bench_experiments.cartpole_seeds(
                ctx.inventory, ctx.workdir, ctx.args.out, log_file
            ),
        )
    finally:
        ctx.down()
    best = ctx.fig("best return", "return", "sac", [sac["best_return"] if sac else None])
    ratio_fig = ctx.fig("eval / training", "ratio", "cartpole", [seeds["ratio"] if seeds else None])
    return [
        Row(
            "experiments",
            "SAC on Pendulum-v1: best training return",
            best,
            None,
            None,
            "the best episode_return_mean of the run",
            "≥ -400",
            meets(best.median, lambda r: r >= -400) if best.runs else None,
            "examples/experiments/pendulum-sac.yaml (RLlib's tuned example: stop at -250 or "
            "20,000 env steps) through `provisioner submit`, on the lab cluster",
            {"run": sac},
            id="sac-pendulum-return",
            value=best.median if best.runs else None,
            value_unit="return",
        ),
        Row(
            "experiments",
            "CartPole PPO: evaluation over training return",
            ratio_fig,
            None,
            None,
            "eval's mean return over 20 episodes / the training return at the checkpoint",
            "≥ 0.9",
            meets(ratio_fig.median, lambda r: r >= 0.9) if ratio_fig.runs else None,
            "examples/experiments/cartpole-ppo.yaml with seeds 0, 1, 2 stopped at return "
            f"{bench_experiments.CARTPOLE_STOP:g}; `provisioner eval` of the best trial's last "
            "checkpoint (no exploration, on the cluster's env runners); the three seeds "
            "compared in bench-results/compare-cartpole-seeds.png, the recorded episode in "
            "bench-results/eval-cartpole.mp4",
            {"run": seeds},
            id="eval-return-ratio",
            value=ratio_fig.median if ratio_fig.runs else None,
            value_unit="ratio",
        ),
    ]


def rows_sweeps(ctx: Context) -> list[Row]:
    """Issue 46's sweep figures: how fully a sweep keeps the cluster's CPUs busy, and how
    long a trial takes from a free slot to its first iteration."""
    log_file = up_with_log(ctx, "sweeps.log")
    try:
        got = ctx.rep.run(
            "sweep", lambda: bench_experiments.sweep(ctx.inventory, ctx.workdir, log_file)
        )
    finally:
        ctx.down()
    use = ctx.fig("used / offered", "ratio", "sweep", [got["utilization"] if got else None])
    starts = ctx.fig("trial start", "s", "sweep", list(got["trial_start_s"]) if got else [None])
    what = (
        "a sweep from an experiment file through `provisioner submit`: PPO on CartPole, "
        "one learning rate per CPU of the lab cluster x 2 seeds (two waves of trials of one "
        f"length, {bench_experiments.SWEEP_ITERATIONS} iterations, 1 CPU each), Tune placing "
        "them; a trial's CPUs held from Tune asking for its actor (its resources ready; "
        "the algorithm is set up after that, on them) to its process's exit (after its "
        "last result: the final checkpoint, the actor's stop), from Ray's state API on the "
        "head, else from Tune's RUNNING (after the set-up) to its last result"
        + (
            f"; from Tune's records alone: {got['utilization_from_tune_running']:.2f}"
            if got and got.get("utilization_from_tune_running") is not None
            else ""
        )
    )
    return [
        Row(
            "sweeps",
            "sweep: CPU-seconds held by trials over CPU-seconds offered",
            use,
            None,
            None,
            "the trials' CPUs x from Tune asking for their actors to their processes' exit / "
            "the cluster's CPUs x the sweep's time",
            "≥ 0.85",
            meets(use.median, lambda r: r >= 0.85) if use.runs else None,
            what,
            {"run": got},
            id="sweep-utilization",
            value=use.median if use.runs else None,
            value_unit="ratio",
        ),
        Row(
            "sweeps",
            "sweep: from a free slot to a trial's first iteration",
            starts,
            None,
            None,
            "seconds, median (min and max in the figure) over the trials that waited",
            "as short as Tune allows",
            None,
            what + "; a trial's start: the latest trial's CPUs freed before it took them, to "
            "its first result (Tune placing it, its actor and algorithm built, one iteration)",
            {"run": got},
            id="trial-start-s",
            value=starts.median if starts.runs else None,
            value_unit="s",
        ),
    ]


def rows_scale(ctx: Context) -> list[Row]:
    """Labs of each --scale-nodes size, one at a time (made here, removed after)."""
    args = ctx.args
    small = bench_scale.small_pin(ctx.pin_path, args.scale_image)
    results: list[dict[str, Any]] = []
    earlier = args.out / "scale.json"
    if args.scale_merge and earlier.exists():  # sizes measured by an earlier run stay
        measured = args.scale_only or args.scale_nodes
        results = [r for r in json.loads(earlier.read_text()) if r["nodes"] not in measured]
    for i, n in enumerate(args.scale_nodes):  # each size keeps its subnet: its place here
        if args.scale_only and n not in args.scale_only:
            continue
        cfg = bench_scale.lab_config(args.lab, args.subnet, n, i)
        log(f"scale: {n} nodes on lab {cfg.name} ({cfg.subnet})")
        got = ctx.rep.run(
            f"scale/{n}/lab",
            lambda cfg=cfg, n=n: bench_scale.measure(
                n,
                cfg,
                ctx.pin_path,
                small,
                ctx.rep,
                log,
                limit=args.limit,
                bring_up=n <= args.scale_bring_up_max,
                workdir=ctx.workdir / f"scale-{n}",
            ),
        )
        results.append(got if got is not None else {"nodes": n, "failed": True})
        results.sort(key=lambda r: int(r["nodes"]))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
    scale_plot(results, small.size, args.out / "scale.png")
    (args.out / "scale.md").write_text(scale_markdown(results, small.size))
    return scale_rows(ctx, results, small.size)


def _get(d: dict[str, Any] | None, *keys: str) -> float | None:
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return float(d)  # type: ignore[arg-type]


def _first(runs: list[dict[str, Any] | None] | None, key: str) -> float | None:
    for r in runs or []:
        if r is not None and r.get(key) is not None and math.isfinite(r[key]):
            return float(r[key])
    return None


def scale_series(results: list[dict[str, Any]], image: int) -> dict[str, list[float | None]]:
    """Per N (in order): every plotted figure (None where it was not measured)."""
    s: dict[str, list[float | None]] = {k: [] for k in (
        "n", "up_alive", "ray_alive", "ray_start", "up_overhead", "doctor", "down",
        *(f"{m}_{f}" for m in bench_scale.MODES for f in ("s", "control", "busiest")),
    )}  # fmt: skip
    for r in results:
        s["n"].append(float(r["nodes"]))
        alive, start = _first(r.get("up"), "alive"), _first(r.get("up"), "ray_start")
        s["up_alive"].append(alive)
        s["ray_alive"].append(_first(r.get("ray_up"), "alive"))
        s["ray_start"].append(start)
        s["up_overhead"].append(None if alive is None or start is None else alive - start)
        s["doctor"].append(_get(r, "doctor_s"))
        s["down"].append(_get(r, "down_s"))
        for m in bench_scale.MODES:
            s[f"{m}_s"].append(_get(r, "push", m, "seconds"))
            for f, key in (("control", "control_wire_bytes"), ("busiest", "busiest_wire_bytes")):
                v = _get(r, "push", m, key)
                s[f"{m}_{f}"].append(None if v is None else v / image)
    return s


def scale_markdown(results: list[dict[str, Any]], image: int) -> str:
    """The scale table: one column per lab size (— where a figure was not measured)."""
    s = scale_series(results, image)

    def row(label: str, key: str, fmt: str) -> str:
        cells = ["—" if v is None else fmt.format(v) for v in s[key]]
        return f"| {label} | " + " | ".join(cells) + " |"

    head = "| nodes | " + " | ".join(str(int(n)) for n in s["n"]) + " |"
    lines = [head, "|---|" + "---|" * len(s["n"])]
    lines += [
        row("`provisioner up`: every node alive (s)", "up_alive", "{:.1f}"),
        row("`ray up`: every node alive (s)", "ray_alive", "{:.1f}"),
        row("Ray's own start under `up` (s), the floor", "ray_start", "{:.1f}"),
        row("what `up` adds to Ray's start (s)", "up_overhead", "{:.1f}"),
        row("doctor (s)", "doctor", "{:.2f}"),
        row("`provisioner down` (s)", "down", "{:.1f}"),
    ]
    for m, name in (("direct", "direct"), ("star", "star"), ("forward", "chain")):
        lines += [
            row(f"push {name}: time (s)", f"{m}_s", "{:.1f}"),
            row(f"push {name}: control machine sent (images)", f"{m}_control", "{:.2f}"),
            row(f"push {name}: busiest node sent (images)", f"{m}_busiest", "{:.2f}"),
        ]
    return "\n".join(lines) + "\n"


def scale_plot(results: list[dict[str, Any]], image: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = scale_series(results, image)
    n = s["n"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))

    def line(ax: Any, key: str, label: str, style: str = "o-") -> None:
        pts = [(x, y) for x, y in zip(n, s[key], strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)

    ax = axes[0]
    line(ax, "up_alive", "provisioner up: every node alive")
    line(ax, "ray_alive", "ray up: every node alive")
    line(ax, "ray_start", "Ray's own start under up (floor)", "s--")
    line(ax, "doctor", "doctor")
    line(ax, "down", "provisioner down")
    ax.set(title="bring-up, doctor, down", xlabel="nodes", ylabel="seconds")
    ax = axes[1]
    for m in bench_scale.MODES:
        line(ax, f"{m}_s", f"push {m}")
    ax.set(title=f"push of a {image / 1e6:.0f} MB image: time", xlabel="nodes", ylabel="seconds")
    ax = axes[2]
    for m in bench_scale.MODES:
        line(ax, f"{m}_control", f"{m}: control machine sent", "o-")
        line(ax, f"{m}_busiest", f"{m}: busiest node sent", "x--")
    ax.set(title="push: bytes on the wire", xlabel="nodes", ylabel="images' worth")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale_rows(ctx: Context, results: list[dict[str, Any]], image: int) -> list[Row]:
    s = scale_series(results, image)
    rows: list[Row] = []
    mb = f"{image / 1e6:.0f} MB test image"

    def fig(label: str, unit: str, value: float | None, key: str) -> Figure:
        return ctx.fig(label, unit, key, [value])

    for i, n_f in enumerate(s["n"]):
        n = int(n_f)
        up_a = fig("provisioner up", "s", s["up_alive"][i], f"scale/{n}/bring-up/up")
        ray_a = fig("ray up", "s", s["ray_alive"][i], f"scale/{n}/bring-up/ray up")
        over = s["up_overhead"][i]
        rows.append(Row(
            "scale", f"scale, {n} nodes: bring-up until every node is alive", up_a, ray_a,
            ratio(up_a, ray_a), "up / ray up", "—", None,
            "image present on every node, from down; Ray's own start under `up`: "
            + ("—" if s["ray_start"][i] is None else f"{s['ray_start'][i]:.1f} s")
            + "; what `up` adds to it: " + ("—" if over is None else f"{over:.1f} s"),
            {"ray_start_s": s["ray_start"][i], "up_overhead_s": over},
        ))  # fmt: skip
        rows.append(Row(
            "scale", f"scale, {n} nodes: doctor, down", fig("doctor", "s", s["doctor"][i],
            f"scale/{n}/doctor"), fig("down", "s", s["down"][i], f"scale/{n}/down"), None, "",
            "—", None, f"`provisioner doctor` on the {n}-node lab; `provisioner down` of its "
            "cluster",
        ))  # fmt: skip
        for m in bench_scale.MODES:
            busiest = s[f"{m}_busiest"][i]
            control = s[f"{m}_control"][i]
            rows.append(Row(
                "scale", f"scale, {n} nodes: push {m}",
                fig(f"push {m}", "s", s[f"{m}_s"][i], f"scale/{n}/push/{m}"),
                None, busiest, "busiest node sent, in images", "≤ 2 images" if m == "forward"
                else "—", None if m != "forward" or busiest is None else busiest <= 2,
                f"the {mb} to {n} nodes holding none of it; bytes counted on the wire "
                f"(iptables in each node): control machine sent "
                + ("—" if control is None else f"{control:.2f}")
                + " images, busiest node " + ("—" if busiest is None else f"{busiest:.2f}"),
                {"control_images": control, "busiest_images": busiest},
            ))  # fmt: skip
    return rows


ROWS: dict[str, Callable[[Context], list[Row]]] = {
    "bring-up": rows_bring_up,
    "fan-out": rows_fan_out,
    "latency": rows_latency,
    "ssh": rows_ssh,
    "push": rows_push,
    "link": rows_link,
    "training": rows_training,
    "tls": rows_tls,
    "project": rows_project,
    "experiments": rows_experiments,
    "sweeps": rows_sweeps,
    "scale": rows_scale,
}


# --- main ---------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--rows",
        default=",".join(DEFAULT_GROUPS),
        help="comma-separated: " + ", ".join(GROUPS) + "; all: every one (scale too)",
    )
    p.add_argument("--lab", default=os.environ.get("PROVISIONER_LAB_NAME", "bench"))
    p.add_argument("--subnet", default=os.environ.get("PROVISIONER_LAB_SUBNET", "10.250.60.0/24"))
    p.add_argument(
        "--flavours",
        default="bookworm,trixie,trixie",
        help="a new lab's node flavours (`provisioner lab up --flavours`): the link rows "
        "push to the first worker, a Docker 26 node by default (its docker load reads zstd)",
    )
    p.add_argument("--lock", type=Path, default=ROOT / "images" / "image.lock.json")
    p.add_argument("--repeat", type=int, default=3, help="repeats of every figure")
    p.add_argument(
        "--retries", type=int, default=2, help="fresh attempts of a repeat that failed (recorded)"
    )
    p.add_argument("--push-repeat", type=int, default=1, help="repeats of the push figures")
    p.add_argument("--link-repeat", type=int, default=3, help="repeats of the link rows")
    p.add_argument(
        "--link-mbit", default="50", help="link rows: limited rates in Mbit/s (and the lab's own)"
    )
    p.add_argument("--up-repeat", type=int, default=1, help="repeats of `up` per added delay")
    p.add_argument("--endpoints", type=int, default=100)
    p.add_argument("--parallel", type=int, default=0, help="fan-out parallelism (0: endpoints)")
    p.add_argument("--delays", default="0,50,100", help="added RTTs in ms, the first the base")
    p.add_argument("--small-image", type=int, default=0, metavar="MB", help="push a small image")
    p.add_argument("--runners", type=int, default=3, help="largest env runner count")
    p.add_argument("--train-steps", type=int, default=8000)
    p.add_argument("--train-batch", type=int, default=1000)
    p.add_argument("--limit", type=float, default=600, help="seconds one bring-up may take")
    p.add_argument("--keep-lab", action="store_true", help="keep a lab made here")
    p.add_argument("--scale-nodes", default="3,6,10", help="scale rows: lab sizes, one at a time")
    p.add_argument("--scale-image", type=int, default=64, metavar="MB", help="scale push image")
    p.add_argument(
        "--scale-merge",
        action="store_true",
        help="keep the other lab sizes of an earlier scale.json in --out",
    )
    p.add_argument("--scale-only", default="", help="measure only these of --scale-nodes")
    p.add_argument(
        "--scale-bring-up-max",
        type=int,
        default=10,
        metavar="N",
        help="scale: bring-up rows (the pin on every node: disk) up to N nodes",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    p.epilog = "bench.md again from a bench.json: scripts/bench.py --render DIR/bench.json"
    args = p.parse_args(argv)
    args.groups = [g.strip() for g in args.rows.split(",") if g.strip()]
    if args.groups == ["all"]:
        args.groups = list(GROUPS)
    unknown = [g for g in args.groups if g not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {', '.join(GROUPS)}")
    try:
        args.delays = [int(x) for x in args.delays.split(",")]
        args.link_mbit = [float(x) for x in args.link_mbit.split(",") if x.strip()]
        args.scale_nodes = [int(x) for x in args.scale_nodes.split(",")]
        args.scale_only = [int(x) for x in args.scale_only.split(",") if x.strip()]
    except ValueError:
        p.error("--delays and --scale-nodes: comma-separated numbers")
    if min(args.repeat, args.push_repeat, args.up_repeat, args.endpoints, args.runners) < 1:
        p.error("--repeat, --push-repeat, --up-repeat, --endpoints and --runners must be ≥ 1")
    if args.retries < 0:
        p.error("--retries must be ≥ 0")
    return args


def ensure_lock(path: Path) -> Path:
    if path.exists():
        return path
    from provisioner.image.build import BuildOptions, build_image
    from provisioner.lab.images import ensure_base_image

    log(f"no pin at {path}: building the image (from the build cache when it was built before)")
    images = ROOT / "images"
    opts = BuildOptions(
        images_dir=images,
        wheelhouse=images / ".wheelhouse",
        lock_path=path,
        base=ensure_base_image(log),
    )
    result = build_image(opts, log)
    assert result.lock_path is not None
    return result.lock_path


def main(argv: list[str]) -> int:
    if argv[:1] == ["--render-scale"] and len(argv) == 3:  # scale.md, .png from scale.json
        path, image = Path(argv[1]), int(argv[2])
        results = json.loads(path.read_text())
        scale_plot(results, image, path.with_name("scale.png"))
        text = scale_markdown(results, image)
        path.with_name("scale.md").write_text(text)
        print(text)
        return 0
    if argv[:1] == ["--render"] and len(argv) == 2:  # bench.md again from a bench.json
        path = Path(argv[1])
        text = markdown(json.loads(path.read_text()))
        path.with_name("bench.md").write_text(text)
        print(text)
        return 0
    args = parse(argv)
    started = datetime.now(UTC)
    meta: dict[str, Any] = {"machine": machine(), "command": " ".join(["scripts/bench.py", *argv])}
    lock = ensure_lock(args.lock)
    try:
        cfg, existed = load_config(args.lab), True  # an existing lab, on its own subnet
    except InputError:
        flavours = tuple(args.flavours.split(","))
        cfg = LabConfig(name=args.lab, subnet=args.subnet, nodes=3, flavours=flavours)
        existed = False
    needs_lab = any(g != "scale" for g in args.groups)  # scale makes labs of its own
    if needs_lab:
        log(f"lab {args.lab}: {'reusing' if existed else 'starting'}")
        lab = lab_up(cfg, log, lock)
        faults.clear(lab)
    else:
        lab = None
    rows: list[Row] = []
    pinned = False
    with tempfile.TemporaryDirectory(prefix="provisioner-bench-") as tmp:
        ctx = Context(lab, lock, args, Path(tmp), Repeats(args.retries, log))
        # push first: with the pin itself it leaves every node holding it for the rest
        order = sorted(args.groups, key=lambda g: (g != "push", GROUPS.index(g)))
        try:
            for group in order:
                needs_pin = (
                    "bring-up", "latency", "training", "tls", "project", "experiments", "sweeps"
                )  # fmt: skip
                if group in needs_pin and not pinned:
                    log("the pin on every node")
                    ctx.ensure_pin()
                    pinned = True
                log(f"{group} ...")
                t0 = time.monotonic()
                rows += run_group(ctx, group)
                pinned = pinned or (group == "push" and not args.small_image)
                log(f"{group}: {time.monotonic() - t0:.0f} s")
                write(args, meta, rows, started, len(lab.nodes) if lab else 0)  # kept on failure
        finally:
            if lab is not None:
                faults.clear(lab)
                if not existed and not args.keep_lab:
                    lab_down(cfg, log)
    print(write(args, meta, rows, started, len(lab.nodes) if lab else 0))
    return 0


def run_group(ctx: Context, group: str) -> list[Row]:
    """The group's rows; a group that fails outside its repeats (its lab set-up, say) gives
    one row saying so, with the error, and the run goes on with the next group."""
    rows = ctx.rep.run(f"{group}/group", lambda: ROWS[group](ctx))
    if rows is not None:
        return rows
    try:
        faults.clear(ctx.lab)
        ctx.down()
    except (Exception, SystemExit) as exc:  # the next group's own set-up says more
        log(f"{group}: cleaning up after the failure failed too: {exc}")
    failed = ctx.fig("this group", "", f"{group}/group", [None])
    return [Row(group, f"{group}: every attempt failed", failed, None, None, "", "—", None, "")]


def shown_path(path: Path) -> str:
    """A path as the record keeps it: relative to the repository, else its name only (no
    machine path in a committed record)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def write(
    args: argparse.Namespace, meta: dict[str, Any], rows: list[Row], started: datetime, nodes: int
) -> str:
    """bench.json and bench.md from the rows so far; the Markdown returned."""
    meta.update(
        started=started.isoformat(timespec="seconds"),
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        lab_nodes=nodes,
        repeat=args.repeat,
        push_repeat=args.push_repeat,
        options={k: (shown_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    )
    done = sorted(rows, key=lambda r: GROUPS.index(r.group))
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "rows": [r.to_json() for r in done]}
    (args.out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    (args.out / "bench.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
