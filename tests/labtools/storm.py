"""A storm of faults on a lab while one training run goes on with `submit --retries`.

`make soak` runs a long storm (scripts/soak.py, record in bench-results/soak.json); the
e2e suite runs a short one. The run is a real `provisioner submit` process, watched
through its log (`--verbose`: the job's own `iter N` lines). Each fault is injected at a
random moment once training is going, undone after its time, and measured:

- `resumed_s`: from the fault until the first iteration after it (of a new attempt, when
  the fault made the job fail);
- `caught_up_s`: until an iteration beyond the last one reached before the fault;
- `iterations_lost`: the iterations computed twice (the last one reached before the
  fault, less the checkpoint the next attempt resumed from);
- `return_before` / `return_after`: the mean return of the WINDOW (5) iterations up to
  the resume point and of the first WINDOW after it; `continuous` when the second is at
  least half the first. A policy that starts over shows a fresh policy's returns (the
  first 5 iterations of CartPole: 20-80 against 450-500 before); a restored one may dip
  for an iteration or two, as PPO does at any point (one CI storm: 472 -> 224 over 3
  iterations after a head kill, every runner holding the restored weights by digest),
  so the window is 5, not 3.

Faults: a worker's or the head's Ray container killed, a worker cut off from the head
(30-90 s), the following client SIGKILLed then reattached (`jobs logs --follow
--retries`), sshd restarted on the head, a worker powered off and back on.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import LabError
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container

KINDS = ("worker_kill", "head_kill", "worker_cut", "client_kill", "sshd_restart", "worker_off")
# Faults that fail the running attempt (a node that hosts an env runner, or the head, is
# lost): the run goes on in a new attempt. The others leave the attempt running.
HEAL_FIX = "`provisioner lab fault clear` undoes every fault; read the run's log, then run it again"
FAILING = frozenset({"worker_kill", "head_kill", "worker_cut", "worker_off"})
ITER = re.compile(r"\biter +(\d+) +steps +\d+ +return")
RESUMED = re.compile(r"resumed from \S+ at iteration (\d+)")
JOB = re.compile(r"(?: as job |attempt \d+: job )(\S+)")


@dataclass
class FaultRecord:
    kind: str
    node: str
    at_s: float  # since the run started
    job_before: str = ""  # the attempt that was running
    job_after: str = ""  # the attempt that went on (another one when the fault failed it)
    undone_at_s: float | None = None
    resumed_s: float | None = None
    caught_up_s: float | None = None
    reached_before: int = 0
    resumed_from: int | None = None
    iterations_lost: int = 0
    return_before: float | None = None
    return_after: float | None = None
    continuous: bool | None = None
    note: str = ""


@dataclass
class Watch:
    """What the run's clients showed so far: each job's iteration lines (the first time
    each is shown: a reattached client replays the log from its start), with the time
    they were seen. The client may be replaced (reattached): each client's log is read."""

    logs: list[Path] = field(default_factory=list)
    offsets: dict[Path, int] = field(default_factory=dict)
    current: dict[Path, str] = field(default_factory=dict)  # the job a log is showing
    seen: set[tuple[str, int]] = field(default_factory=set)
    iters: list[tuple[float, str, int]] = field(default_factory=list)  # (t, job, iteration)
    jobs: list[str] = field(default_factory=list)
    resumes: dict[str, int] = field(default_factory=dict)  # job -> the iteration it resumed at

    def follow(self, log: Path, job: str = "") -> None:
        self.logs.append(log)
        self.current[log] = job

    def poll(self) -> None:
        now = time.monotonic()
        for log in self.logs:
            if not log.exists():
                continue
            with open(log, "rb") as f:
                f.seek(self.offsets.get(log, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self.offsets[log] = self.offsets.get(log, 0) + end
            for line in chunk[:end].decode(errors="replace").splitlines():
                if m := JOB.search(line):
                    self.current[log] = m.group(1)
                    if m.group(1) not in self.jobs:
                        self.jobs.append(m.group(1))
                if r := RESUMED.search(line):
                    self.resumes[self.current[log]] = int(r.group(1))
                m = ITER.search(line)
                key = (self.current[log], int(m.group(1))) if m else None
                if key is not None and key not in self.seen:
                    self.seen.add(key)
                    self.iters.append((now, *key))

    def reached(self) -> int:
        return max((i for _, _, i in self.iters), default=0)

    def job(self) -> str:
        return self.jobs[-1] if self.jobs else ""


@dataclass
class Storm:
    lab: LabInfo
    inventory: Path
    results: Path
    playbook: Path
    args: list[str]
    retries: int
    work: Path
    seed: int = 0
    report: Callable[[str], None] = print
    records: list[FaultRecord] = field(default_factory=list)
    watch: Watch = field(default_factory=Watch)
    client: subprocess.Popen[bytes] | None = None
    clients: int = 0
    started: float = 0.0

    # --- the run ----------------------------------------------------------------------

    def _spawn(self, *args: str, job: str = "") -> None:
        self.clients += 1
        log = self.work / f"client-{self.clients}.log"
        self.watch.follow(log, job)
        with open(log, "wb") as err, open(log.with_suffix(".out"), "wb") as out:
            self.client = subprocess.Popen(
                [sys.executable, "-m", "provisioner", *args], stdout=out, stderr=err
            )

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self._spawn(
            "submit", "-i", str(self.inventory), "--results", str(self.results), "--json",
            "--verbose", "--retries", str(self.retries), str(self.playbook), "--", *self.args,
        )  # fmt: skip

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch.poll()
            if predicate():
                return
            if self.client is not None and self.client.poll() is not None:
                raise LabError(
                    f"the run's client exited ({self.client.returncode}) {what}",
                    HEAL_FIX,
                )
            time.sleep(0.5)
        raise LabError(
            f"timed out after {timeout:.0f}s waiting {what}",
            HEAL_FIX,
        )

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the client to end; its JSON outcome."""
        assert self.client is not None
        self.client.wait(timeout)
        self.watch.poll()
        out = self.watch.logs[-1].with_suffix(".out")
        doc: dict[str, Any] = json.loads(out.read_text())
        self.settle(str(doc.get("job_id", self.watch.job())))
        return doc

    # --- faults ---------------------------------------------------------------------------

    def _nodes(self) -> tuple[LabNode, list[LabNode]]:
        head, *workers = self.lab.nodes
        return head, workers

    def _kill_container(self, node: LabNode) -> None:
        name = ray_container(load_inventory(self.inventory))
        rc, out = exec_rc(node.container, f"docker kill {name}")
        if rc != 0:
            raise LabError(
                f"{node.name}: docker kill failed: {out[-300:]}",
                HEAL_FIX,
            )

    def _busy_workers(self, workers: list[LabNode]) -> list[LabNode]:
        """The workers that host an env runner of the running attempt (its runners.json,
        home while followed); all of them when it is not known yet."""
        path = self.results / self.watch.job() / "runners.json"
        for _ in range(60):  # it comes home with the results, a few seconds after the start
            try:
                addresses = {r["node_ip"] for r in json.loads(path.read_text())}
                return [w for w in workers if w.address in addresses] or workers
            except (OSError, ValueError, KeyError, TypeError):
                time.sleep(0.5)
        return workers

    def inject(self, kind: str, rng: random.Random) -> FaultRecord:
        head, workers = self._nodes()
        worker = rng.choice(self._busy_workers(workers))
        node = head if kind in ("head_kill", "sshd_restart") else worker
        self.watch.poll()
        rec = FaultRecord(
            kind,
            node.name,
            self.elapsed(),
            job_before=self.watch.job(),
            reached_before=self.watch.reached(),
        )
        self.report(f"[{rec.at_s:7.1f}s] fault: {kind} on {node.name}")
        if kind in ("worker_kill", "head_kill"):
            self._kill_container(node)
        elif kind == "worker_cut":
            hold = rng.uniform(30, 90)
            faults.cut(self.lab, head, worker)
            try:
                time.sleep(hold)
            finally:
                faults.uncut(self.lab, head, worker)
            rec.note = f"cut for {hold:.0f} s"
        elif kind == "client_kill":
            assert self.client is not None
            self.client.send_signal(signal.SIGKILL)
            self.client.wait(30)
            time.sleep(rng.uniform(2, 8))
            self.watch.poll()
            job = self.watch.job()
            self._spawn(
                "jobs", "logs", job, "--follow", "--retries", str(self.retries), "-i",
                str(self.inventory), "--results", str(self.results), "--json", "--verbose",
                job=job,
            )  # fmt: skip
            rec.note = f"reattached to {job}"
        elif kind == "sshd_restart":
            # the listener only (its pid file): sessions already open go on, as on a node
            # whose sshd is restarted by its package manager
            restart = "kill $(cat /run/sshd.pid) && sleep 1 && /usr/sbin/sshd"
            rc, out = exec_rc(node.container, restart)
            if rc != 0:
                raise LabError(
                    f"{node.name}: sshd restart failed: {out[-300:]}",
                    HEAL_FIX,
                )
        elif kind == "worker_off":
            hold = rng.uniform(15, 40)
            faults.stop(self.lab, worker)
            try:
                time.sleep(hold)
            finally:
                faults.start(self.lab, worker)
            rec.note = f"off for {hold:.0f} s"
        else:
            raise LabError(f"unknown fault {kind}", f"name one of: {', '.join(KINDS)}")
        rec.undone_at_s = self.elapsed()
        self.records.append(rec)
        return rec

    def measure(self, rec: FaultRecord, timeout: float) -> None:
        """Wait until training went on past where it was: the times. What was lost and
        the returns come from the result files when the run is over (`settle`)."""
        t0 = self.started + rec.at_s
        fails = rec.kind in FAILING

        def went_on() -> bool:
            return any(
                t > t0 and i > rec.reached_before and (job != rec.job_before) == fails
                for t, job, i in self.watch.iters
            )

        what = "a new attempt" if fails else "the same attempt"
        self.wait_for(f"for training to go on in {what} after {rec.kind}", went_on, timeout)
        after = [(t, job, i) for t, job, i in self.watch.iters if t > t0]
        rec.job_after = next(j for _, j, i in after if (j != rec.job_before) == fails)
        first = next(t for t, job, _ in after if job == rec.job_after)
        rec.resumed_s = round(first - t0, 1)
        rec.caught_up_s = round(
            next(t for t, j, i in after if j == rec.job_after and i > rec.reached_before) - t0, 1
        )
        self.report(
            f"[{self.elapsed():7.1f}s] {rec.kind}: training went on after {rec.resumed_s} s "
            f"(job {rec.job_after}), past iteration {rec.reached_before} after "
            f"{rec.caught_up_s} s"
        )

    def settle(self, last_job: str) -> None:
        """From the result files of every attempt (home, verified): for each fault, the
        iteration the next attempt resumed from, the iterations computed twice, and the
        mean return of the WINDOW iterations up to the resume point and of the first
        WINDOW after."""
        final = _returns(self.results / last_job / "metrics.csv")
        for rec in self.records:
            if rec.job_after and rec.job_after != rec.job_before:
                # the job's own line, as its client showed it (the job.log of an attempt
                # whose head died never comes home)
                rec.resumed_from = self.watch.resumes.get(rec.job_after, 0)
                done = _returns(self.results / rec.job_before / "metrics.csv")
                rec.iterations_lost = max(0, max(done, default=0) - rec.resumed_from)
                point = rec.resumed_from
            else:
                point = rec.reached_before
            rec.return_before, rec.return_after, rec.continuous = continuity(final, point)
            self.report(
                f"{rec.kind}: resumed from {rec.resumed_from}, {rec.iterations_lost} "
                f"iteration(s) computed twice; return {_fmt(rec.return_before)} -> "
                f"{_fmt(rec.return_after)}"
            )

    def run(
        self, kinds: list[str], *, gap: tuple[float, float], warmup: int, timeout: float
    ) -> None:
        """Inject `kinds` in order, each `gap` seconds (random) after training went on
        again; the first once the run reached iteration `warmup`."""
        rng = random.Random(self.seed)
        self.wait_for("for the first iterations", lambda: self.watch.reached() >= warmup, timeout)
        for kind in kinds:
            time.sleep(rng.uniform(*gap))
            rec = self.inject(kind, rng)
            self.measure(rec, timeout)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]


def schedule(count: int, seed: int) -> list[str]:
    """`count` faults, every kind at least once (when count allows), in a random order."""
    rng = random.Random(seed)
    kinds = list(KINDS)[:count] + [rng.choice(KINDS) for _ in range(max(0, count - len(KINDS)))]
    rng.shuffle(kinds)
    return kinds


NAN = float("nan")
WINDOW = 5


def continuity(
    returns: dict[int, float], point: int
) -> tuple[float | None, float | None, bool | None]:
    """The mean return of the WINDOW iterations up to `point` and of the first WINDOW
    after it (iterations with no finished episode left out), and whether the second is at
    least half the first (None: either side had no episode)."""
    before = _mean([returns.get(i, NAN) for i in range(point - WINDOW + 1, point + 1)])
    after = _mean([returns.get(i, NAN) for i in range(point + 1, point + WINDOW + 1)])
    if before is None or after is None:
        return before, after, None
    return before, after, after >= 0.5 * before


def _returns(path: Path) -> dict[int, float]:
    """iteration -> mean return, from a metrics.csv (none when it is missing)."""
    if not path.is_file():
        return {}
    rows = path.read_text().splitlines()[1:]
    return {int(r.split(",")[0]): float(r.split(",")[2] or "nan") for r in rows}


def _mean(values: list[float]) -> float | None:
    got = [v for v in values if v == v]  # NaN: an iteration with no finished episode
    return round(sum(got) / len(got), 1) if got else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
