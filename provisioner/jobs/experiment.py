"""`provisioner submit -i INV EXPERIMENT.yaml`: an experiment file run as a job (issue 45).

Before anything is sent: the file is read, then validated against the image's facts (the
file beside the pin, `image.facts`; a pin older than the facts: captured on the head, one
round trip) and the cluster's capacity (the GCS's alive nodes, their CPUs and GPUs: one
round trip); every problem is an InputError (exit 2) with its file, line and fix.

Then the job is the file's folder as working_dir (as for a script), its driver
provisioner's runner (`provisioner/experiment/runner.py`, written there by the
entrypoint), which runs the experiment through Tune: progress, results home and
`--resume` are an unchanged Tune script's. Kept here at submit, in results/JOB/: the file
as written (experiment.yaml) and the algorithm config it resolves to (config.json), so
that `submit -i INV results/JOB/experiment.yaml` runs it again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError
from provisioner.experiment import (
    ClusterCapacity,
    Experiment,
    Facts,
    NodeCapacity,
    check,
    parse_experiment,
    raise_problems,
    resolved_config,
    validate,
)
from provisioner.experiment.resolve import overrides
from provisioner.experiment.search import DEFAULT_METRIC, trial_count
from provisioner.jobs.link import Target
from provisioner.jobs.spec import JobSpec, check_job_id, job_id_for
from provisioner.jobs.submit import SUBMITTED_FILE
from provisioner.jobs.tune_watch import METRIC_ENV, MODE_ENV, TRIALS_ENV

SUFFIXES = (".yaml", ".yml")
RUNNER_NAME = "_provisioner_experiment.py"  # the runner, in the job's working_dir
EXPERIMENT_FILE = "experiment.yaml"  # kept in results/JOB/: the file as written
CONFIG_FILE = "config.json"  # kept in results/JOB/: the resolved algorithm config
FACTS_TIMEOUT_S = 600.0  # the capture imports RLlib's every algorithm: tens of seconds


def is_experiment(path: Path) -> bool:
    """A `.yaml`/`.yml` argument of `submit` is an experiment file."""
    return path.suffix.lower() in SUFFIXES


def read_experiment(path: Path) -> tuple[Experiment, bytes]:
    """The experiment and the file's bytes as written (InputError: no experiment at all)."""
    path = path.expanduser()
    try:
        data = path.read_bytes()
        text = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read the experiment file: {exc.strerror if isinstance(exc, OSError) else exc}",
            "give the path of a readable YAML file",
            where=str(path),
        ) from None
    return parse_experiment(path, text), data


def runner_args(
    exp: Experiment, max_concurrent: int | None = None, max_failures: int | None = None
) -> tuple[str, str]:
    """The runner's arguments (pure): the file's name, then what it runs as one JSON
    argument (the keys the file sets as AlgorithmConfig keys, without the seed: the runner
    grids over `seeds`; a sweep's spaces as written, its samples, scheduler, metric and
    mode; the bound on trials at once; how many times Tune starts a failed trial again
    from its latest checkpoint, `submit --retries`). For a file `validate` passes."""
    body = {
        "name": exp.name,
        "run": exp.run,
        "config": overrides(exp),
        "stop": exp.stop,
        "seeds": list(exp.seeds),
        "checkpoint_frequency": exp.checkpoint_frequency,
    }
    sweep = {
        "num_samples": exp.num_samples if exp.num_samples != 1 else None,
        "scheduler": exp.scheduler,
        "metric": exp.metric,
        "mode": exp.mode,
        "max_concurrent": max_concurrent,
        "max_failures": max_failures or None,
    }
    body.update({k: v for k, v in sweep.items() if v is not None})  # a sweep's, when set
    return exp.path.name, json.dumps(body, sort_keys=True, separators=(",", ":"))


def experiment_spec(
    exp: Experiment,
    job_id: str | None = None,
    max_concurrent: int | None = None,
    max_failures: int | None = None,
) -> JobSpec:
    """The job of an experiment file: its folder the working_dir, the runner its driver,
    the job id from the experiment's name (`cartpole-ppo-20261206-101500-a1b2c3d4e5f6`). A file
    kept in a job's results (results/JOB/experiment.yaml, run again) travels alone: not
    the earlier run's Tune folder and checkpoints beside it."""
    path = exp.path.expanduser().resolve()
    job = check_job_id(job_id) if job_id else job_id_for(Path(f"{exp.name}.yaml"))
    excludes = alone(path) if (path.parent / SUBMITTED_FILE).is_file() else ()
    return JobSpec(
        playbook=path,
        args=runner_args(exp, max_concurrent, max_failures),
        job_id=job,
        env=sweep_env(exp),
        runner=RUNNER_NAME,
        excludes=excludes,
    )


def sweep_env(exp: Experiment) -> dict[str, str]:
    """What the job's watcher of Tune's results (`jobs.tune_watch`) needs to say a sweep's
    progress: how many trials the file makes, and what the best one is judged by."""
    trials = trial_count(exp.config, len(exp.seeds), int(exp.num_samples))
    if trials < 2:
        return {}
    return {
        TRIALS_ENV: str(trials),
        METRIC_ENV: str(exp.metric or DEFAULT_METRIC),
        MODE_ENV: str(exp.mode or "max"),
    }


def alone(path: Path) -> tuple[str, ...]:
    """Ray's `excludes` that leave out everything in the file's folder but the file."""

    def pattern(entry: Path) -> str:
        name = re.sub(r"([\[\]*?!#\\])", r"\\\1", entry.name)
        return f"/{name}/" if entry.is_dir() else f"/{name}"

    return tuple(pattern(e) for e in sorted(path.parent.iterdir()) if e.name != path.name)


def kept_files(exp: Experiment, written: bytes, facts: Facts) -> dict[str, bytes]:
    """What results/JOB/ keeps of the run (pure): the file as written, and the algorithm
    config it resolves to (the first seed's; each trial's own seed is Tune's params.json)."""
    config = resolved_config(exp, facts)
    return {
        EXPERIMENT_FILE: written,
        CONFIG_FILE: (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
    }


def keep(home: Path, files: Mapping[str, bytes]) -> None:
    """Write `files` into the job's results home here (through `remote.receive`)."""
    from provisioner.remote.receive import ensure_directory, write_file

    ensure_directory(home)
    for name, data in files.items():
        write_file(home, name, data)


def capacity_of(nodes: Iterable[object]) -> ClusterCapacity:
    """The cluster's capacity from the GCS's node list (alive nodes' CPU and GPU)."""
    from provisioner.cluster.headprobe import GcsNode

    alive = [n for n in nodes if isinstance(n, GcsNode) and n.alive]
    return ClusterCapacity(
        tuple(
            NodeCapacity(cpus=n.resources.get("CPU", 0.0), gpus=n.resources.get("GPU", 0.0))
            for n in alive
        )
    )


def pin_facts_of(target: Target, report: Reporter) -> Facts | None:
    """The facts beside the inventory's pin; None (and why, reported) when it has none."""
    from provisioner.image.facts import pin_facts
    from provisioner.image.pin import read_pin

    inventory = target.inventory
    path = inventory.image_lock if inventory is not None else None
    if path is None:
        report("the inventory names no image pin: the experiment facts come from the head")
        return None
    try:
        found = pin_facts(read_pin(path), path)
    except InputError as exc:
        report(f"the image's pin cannot be read ({exc.message}): the facts come from the head")
        return None
    if found.facts is None:
        report(f"{found.missing}: capturing them on the head (one round trip)")
    return found.facts


def facts_from_head(target: Target) -> Facts:
    """The capture run by the head's Ray (its container, or its Python): one round trip."""
    from provisioner.experiment.facts import capture_source
    from provisioner.image.facts import checked_capture

    assert target.inventory is not None
    with target.ssh() as session:
        result = session.run(
            target.runtime.python_command(), timeout=FACTS_TIMEOUT_S, stdin=capture_source()
        )
    if not result.ok:
        raise OperationError(
            f"the experiment facts' capture failed on the head: {result.tail(8) or 'no output'}",
            "see that the cluster is up (`provisioner status`) and its image has RLlib",
            where=target.inventory.head.name,
        )
    document = checked_capture(result.stdout.encode(), target.inventory.head.name)
    return Facts.from_json(json.loads(document))


def cluster_capacity(target: Target) -> ClusterCapacity:
    """CPUs and GPUs per alive node, as the head's GCS lists them (one round trip)."""
    from provisioner.cluster.headprobe import gcs_nodes

    assert target.inventory is not None
    with target.ssh() as session:
        nodes = gcs_nodes(session, target.runtime)
    capacity = capacity_of(nodes)
    if not capacity.nodes:
        raise OperationError(
            "the head's GCS lists no alive node",
            "bring the cluster up: provisioner up -i INVENTORY",
            where=target.inventory.head.name,
        )
    return capacity


def prepare_experiment(
    target: Target,
    path: Path,
    results_root: Path,
    report: Reporter = quiet,
    max_concurrent: int | None = None,
    max_failures: int | None = None,
) -> JobSpec:
    """Read and validate the experiment file (facts, then the cluster's capacity), keep it
    and its resolved config in results/JOB/, and return its job. Nothing is sent to the
    cluster's Jobs API here; every problem of the file is an InputError (exit 2)."""
    exp, written = read_experiment(path)
    if target.inventory is None:
        raise InputError(
            "an experiment file needs the inventory: its image's facts and the cluster's "
            "capacity are read over SSH from the head",
            "add -i INVENTORY",
        )
    facts = pin_facts_of(target, report)
    if facts is not None:  # a bad file is refused before any connection
        raise_problems(validate(exp, facts))
    else:
        facts = facts_from_head(target)
        report(
            f"experiment facts captured on the head (Ray {facts.versions.get('ray', '?')}); "
            "`provisioner image build` keeps them beside the pin"
        )
        raise_problems(validate(exp, facts))
    capacity = cluster_capacity(target)
    check(exp, facts, capacity)
    trials = trial_count(exp.config, len(exp.seeds), int(exp.num_samples))
    report(
        f"{exp.path.name}: {exp.run} on {exp.env}, {len(exp.seeds)} seed(s)"
        + (f", {trials} trials" if trials > len(exp.seeds) else "")
        + f"; the cluster has {capacity.cpus:g} CPUs and {capacity.gpus:g} GPUs on "
        f"{len(capacity.nodes)} node(s)"
    )
    spec = experiment_spec(exp, max_concurrent=max_concurrent, max_failures=max_failures)
    keep(results_root / spec.job_id, kept_files(exp, written, facts))
    return spec
