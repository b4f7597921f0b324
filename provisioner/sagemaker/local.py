"""`sagemaker run --instance-type local|local_gpu`: the playbook under the SageMaker SDK's
own local mode (`ModelTrainer`, `Mode.LOCAL_CONTAINER`), on this machine's Docker.

The SDK writes the contract's files (hyperparameters.json, resourceconfig.json per host
`algo-1`..`algo-N`), a docker-compose.yaml with one service per host, and runs
`docker compose up` (v2) or `docker-compose up` (v1, Debian's package) in the foreground;
when the head's container exits, compose stops the others. Offline by construction:

- the image is the local variant of the pin (not an ECR URI, so the SDK pulls nothing and
  never logs in to ECR);
- the channels are local folders (FileSystemDataSource: no S3, so no boto session is made
  for data; `code` holds the playbook's directory, `checkpoints` a private staging folder
  of the run's own, so a checkpoint put there first is continued from, as SageMaker's
  checkpoint location is);
- telemetry is off through the SDK's own config file (TelemetryOptOut), given with
  SAGEMAKER_USER_CONFIG_OVERRIDE; no AWS credentials are read or passed (the SDK only asks
  boto for them when a channel is in S3 or the image in ECR), and the EC2 metadata service
  is not asked for any (AWS_EC2_METADATA_DISABLED).

Local mode has no /opt/ml/checkpoints sync, hence the `checkpoints` channel
(PROVISIONER_SM_CHECKPOINT_DIR).

A job's code runs as root over every folder its containers mount, so no folder this
machine's code writes is ever mounted: RESULTS/JOB is not a channel. What the containers
write (the checkpoint channel, while the job runs and once more at the end; /opt/ml/model
at the end) comes home through `bring` (`provisioner.remote.receive`'s rules: no link
followed, regular files only, bounded, private modes); a container's failure reason is
read without following a link, at most FAILURE_READ_BYTES; the tool's own files
(failure, summary.json, the plots) are written with `receive.write_file`. The SDK's own
copy of /opt/ml/model and /opt/ml/output after the run (`retrieve_artifacts`, a
`shutil.copytree` that follows links: it would read any file here, or /dev/zero until
the disk is full) is not run.

Each job gets a Docker network of its own (`sagemaker-local-JOB`; the SDK names every
job's `sagemaker-local`), so no other local job's containers reach its Ray; and its Ray
runs with a token and TLS of the job's own (the `auth` channel: `make_token`, `add_ca`).
The SDK leaves the compose project's containers and network behind; this module takes the
project down afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError, PrerequisiteError
from provisioner.image.pin import read_pin
from provisioner.jobs.home import finish
from provisioner.jobs.resume import SEEDS, find_source
from provisioner.jobs.spec import job_id_for
from provisioner.jobs.submit import JobOutcome
from provisioner.jobs.tables import read_json
from provisioner.jobs.upload import sendable_files
from provisioner.node import tls
from provisioner.remote.receive import write_file
from provisioner.sagemaker import bring, plan
from provisioner.sagemaker.container import contract
from provisioner.sagemaker.image import ensure_image

COMPOSE_FILE = "docker-compose.yaml"
SDK_NETWORK = "sagemaker-local"  # the network the SDK's compose file names
CHECKPOINTS_CHANNEL = "checkpoints"
LOG_FILE = "sagemaker.log"  # what the SDK and compose printed (every container's output)
OBJECT_STORE_BYTES = 256 * 1024 * 1024  # per container; docker's /dev/shm is 64 MiB
DOWN_TIMEOUT_S = 120
FAILURE_READ_BYTES = 4 * contract.FAILURE_BYTES  # of each container's failure file
# the tool's own names in RESULTS/JOB: what the checkpoint channel holds by these names
# stays there
OWN_NAMES = (LOG_FILE, contract.FAILURE_FILE, "model")


@dataclass(frozen=True)
class RunOptions:
    playbook: Path
    args: tuple[str, ...]
    instance_type: str
    instance_count: int
    results_root: Path
    state_dir: Path
    pin_path: Path
    resume: str | None = None
    price_per_hour: float | None = None


@dataclass
class RunResult(JobOutcome):
    """A SageMaker job's outcome: a `JobOutcome` (status completed | stopped | failed,
    its `results` finished by `jobs.home.finish`) with SageMaker's own fields."""

    seconds: float = 0.0
    image: str = ""
    failure: str | None = None
    files: list[str] = field(default_factory=list)  # every file home, relative
    resumed_from: str | None = None

    @property
    def directory(self) -> Path:
        return self.results.directory

    @property
    def summary(self) -> dict[str, Any] | None:
        return self.results.summary

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "job_id": self.job_id,
            "status": self.status,
            "results": str(self.directory),
            "seconds": round(self.seconds, 1),
            "image": self.image,
            "failure": self.failure,
            "resumed_from": self.resumed_from,
            "summary": self.summary,
            "files": self.files,
        }


_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")
_SERVICE = re.compile(r"^(algo-\d+)(?:_\d+)?\s+\|\s?(.*)$")
_SHOWN = re.compile(
    r"^\[train\]|^iter\s+\d+\s|^summary: |^env runners: |^learners: |^resumed from |^SIGTERM"
    r"|Error|Traceback|error:"
)


def shown(line: str) -> str | None:
    """A line of compose's output as progress (`algo-1: [train] ...`), or None for the
    rest (Ray's own logs, compose's): those stay in sagemaker.log only."""
    line = _ANSI.sub("", line).rstrip()
    m = _SERVICE.match(line)
    if m is None:
        return line if line.startswith(("Aborting", "ERROR")) else None
    host, text = m.groups()
    return f"{host}: {text}" if _SHOWN.search(text) else None


class _Lines(io.TextIOBase):
    """A stdout for the SDK: every line to the log file, the telling ones to the reporter."""

    def __init__(self, log: io.TextIOBase | Any, report: Reporter) -> None:
        self.log = log
        self.report = report
        self.buf = ""
        self.busy = False  # a reporter that itself prints to stdout writes here too

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.log.write(s)
        self.log.flush()
        if self.busy:
            return len(s)
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        self.busy = True
        try:
            for line in lines:
                show = shown(line)
                if show:
                    self.report(show)
        finally:
            self.busy = False
        return len(s)


def check_sdk() -> None:
    try:
        import sagemaker.train  # noqa: F401
    except ImportError:
        raise PrerequisiteError(
            "the SageMaker Python SDK (sagemaker-train) is not installed",
            "pip install 'provisioner[sagemaker]'",
        ) from None


def compose_command() -> list[str]:
    """The compose the SDK will use: `docker compose` v2, else `docker-compose`."""
    try:
        out = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        major = re.search(r"v(\d+)", out.stdout)
        if out.returncode == 0 and major and int(major.group(1)) >= 2:
            return ["docker", "compose"]
    except OSError:
        pass
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise PrerequisiteError(
        "neither `docker compose` (v2) nor `docker-compose` is installed; SageMaker's local "
        "mode runs its containers with one",
        "apt-get install docker-compose (Debian), or install the compose v2 plugin",
    )


@contextlib.contextmanager
def sdk_environment(root: Path) -> Iterator[None]:
    """The SDK's telemetry off (its config file), nothing asked of AWS's metadata service."""
    config = root / "sagemaker-config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\n"
        "SageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
    )
    want = {
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
        "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": str(config),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stage_code(playbook: Path, code: Path) -> None:
    """The playbook's directory, less secrets and links, into the `code` channel."""
    files, _ = sendable_files(playbook.parent)
    for path in files:
        rel = path.relative_to(playbook.parent)
        if rel.parts[0] in ("results", ".venv", "__pycache__", ".git"):
            continue
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, code / rel)


def make_token(root: Path) -> Path:
    """The job's own Ray token: a folder (0700) holding `token` (0600, random), mounted in
    every container as the `auth` channel; Ray reads it by path, so it is in no variable,
    command line or log (see container/train.py)."""
    auth = root / contract.AUTH_CHANNEL
    auth.mkdir(mode=0o700)
    write_file(auth, contract.TOKEN_FILE, secrets.token_hex(32).encode())
    return auth


def ca_label(job_id: str) -> str:
    """The job's name in its CA's common name (at most 64 characters in all): its time and
    random part, which are its own."""
    return f"sagemaker {job_id[-28:]}"


def add_ca(auth: Path, job_id: str) -> None:
    """The job's own TLS CA beside its token in the `auth` folder: `ca.crt` and `ca.key`
    (0600, new per job, deleted with the run's folder). Each container issues its node
    certificate with it at start (container/train.py), so the job's Ray runs TLS: the token
    never crosses the job's network in clear, and only the job's own containers talk to it."""
    ca = tls.new_authority(ca_label(job_id))
    write_file(auth, contract.CA_CERT_FILE, ca.cert_pem())
    key = ca.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_file(auth, contract.CA_KEY_FILE, key)


def seed_resume(value: str, results_root: Path, home: Path) -> str:
    """Put the checkpoint to continue from (and its run's metrics) into `home`, the
    checkpoint channel's folder (before any container mounts it), where the entry point
    finds it."""
    source = find_source(value, results_root)
    shutil.copytree(source.checkpoint, home / "checkpoints" / _iter_name(source.checkpoint))
    if source.results is not None:
        for name in SEEDS:
            src = source.results / name
            if src.is_file():
                shutil.copy2(src, home / name)
            elif src.is_dir():
                shutil.copytree(src, home / name)
    return source.label


def _iter_name(checkpoint: Path) -> str:
    """A checkpoint's folder name as rlrun writes them (iter-NNNNNN); a checkpoint folder of
    another name goes in as iter-000000 (the entry point continues from the latest one;
    RLlib's restored state carries the iteration)."""
    if checkpoint.name.startswith("iter-"):
        return checkpoint.name
    return "iter-000000"


def compose_down(cmd: list[str], root: Path) -> None:
    compose = root / COMPOSE_FILE
    if not compose.is_file():
        return
    subprocess.run(
        [*cmd, "-f", str(compose), "down", "--remove-orphans", "--timeout", "10"],
        capture_output=True,
        timeout=DOWN_TIMEOUT_S,
    )


def failures(root: Path, hosts: int) -> str | None:
    """The failure reasons the containers wrote, head first (a link is not followed, and
    at most FAILURE_READ_BYTES of each are read)."""
    found = []
    for i in range(1, hosts + 1):
        text = bring.read_bounded(
            root / f"algo-{i}" / "output" / contract.FAILURE_FILE, FAILURE_READ_BYTES
        )
        if text is not None:
            found.append(f"algo-{i}: {text.strip()}")
    return "\n".join(found) or None


def channel_skip(parts: tuple[str, ...]) -> bool:
    """Names of the checkpoint channel that do not come home: files still being written
    (`.tmp*`), and the tool's own names at the top."""
    return any(p.startswith(".tmp") for p in parts) or (len(parts) == 1 and parts[0] in OWN_NAMES)


def network_name(job_id: str) -> str:
    """The job's own Docker network (the SDK names every job's `sagemaker-local`)."""
    return f"{SDK_NETWORK}-{job_id}"


def own_network(content: dict[str, Any], network: str) -> bool:
    """Pure: the SDK's compose content with its shared network renamed to `network` (the
    services keep the key `sagemaker-local`, so their host-name aliases stay); whether it
    had that network."""
    found = content.get("networks", {}).get(SDK_NETWORK)
    if not isinstance(found, dict):
        return False
    found["name"] = network
    return True


@contextlib.contextmanager
def sdk_patched(network: str) -> Iterator[None]:
    """Two steps of the SDK's local mode changed while a job runs:

    - its compose file names the job's own network, not the `sagemaker-local` every
      local-mode job shares, so no other job's containers reach this one's Ray;
    - its `retrieve_artifacts` (after compose exits) is not run: it copies every
      container's /opt/ml/model and /opt/ml/output with `shutil.copytree`, following the
      links a job left there; what it would copy comes home through `bring` instead."""
    import yaml
    from sagemaker.train.local.local_container import _LocalContainer

    saved = {
        k: _LocalContainer.__dict__[k] for k in ("retrieve_artifacts", "_generate_compose_file")
    }
    generate = saved["_generate_compose_file"]

    def artifacts_path(self: Any, compose_data: dict[str, Any]) -> str:
        return os.path.join(self.container_root, "artifacts")

    def compose_file(self: Any, environment: dict[str, str], volumes: list[str]) -> Any:
        content = generate(self, environment, volumes)
        if own_network(content, network):
            path = Path(self.container_root) / COMPOSE_FILE
            path.write_text(yaml.dump(content, default_flow_style=False))
        return content

    setattr(_LocalContainer, "retrieve_artifacts", artifacts_path)  # noqa: B010
    setattr(_LocalContainer, "_generate_compose_file", compose_file)  # noqa: B010
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_LocalContainer, name, value)


def run_local(opts: RunOptions, report: Reporter = quiet) -> RunResult:
    """Run the playbook as a SageMaker training job in local mode; its results into
    RESULTS/JOB/."""
    plan.check_local(opts.instance_type, opts.instance_count)
    hyper = plan.hyperparameters(opts.playbook, opts.args)
    check_sdk()
    compose = compose_command()
    pin = read_pin(opts.pin_path)
    image = ensure_image(pin, report)
    job_id = job_id_for(opts.playbook.resolve())
    home = opts.results_root / job_id
    home.mkdir(parents=True, exist_ok=False)
    root = opts.state_dir / "sagemaker" / f"sm-{job_id}"
    root.mkdir(parents=True)
    code = root / "code"
    code.mkdir()
    stage_code(opts.playbook.resolve(), code)
    # the checkpoint channel: the run's own folder, never RESULTS/JOB (see the top)
    staging = root / CHECKPOINTS_CHANNEL
    staging.mkdir(mode=0o700)
    resumed = seed_resume(opts.resume, opts.results_root, staging) if opts.resume else None
    auth = make_token(root)
    add_ca(auth, job_id)
    where = f"SageMaker job {job_id}'s containers"
    channel = bring.Sync(staging, home, "a job's results", where, skip=channel_skip)
    model = bring.Sync(root / "model", home / "model", "a job's model", where)
    env = {
        contract.CHECKPOINT_DIR_ENV: str(contract.DATA_DIR / CHECKPOINTS_CHANNEL),
        "PROVISIONER_SM_OBJECT_STORE_BYTES": str(OBJECT_STORE_BYTES),
    }
    started = time.monotonic()
    failure: str | None = None
    try:
        with sdk_environment(root), open(home / LOG_FILE, "w") as log:
            from sagemaker.core.training.configs import Compute, InputData
            from sagemaker.train import ModelTrainer
            from sagemaker.train.model_trainer import Mode

            trainer = ModelTrainer(
                training_image=image.tag,
                training_mode=Mode.LOCAL_CONTAINER,
                base_job_name=plan.base_job_name(opts.playbook),
                compute=Compute(
                    instance_type=opts.instance_type, instance_count=opts.instance_count
                ),
                hyperparameters=hyper,
                environment=env,
                local_container_root=str(root),
            )
            report(f"job {job_id}: {opts.instance_count} x {opts.instance_type}, image {image.tag}")
            with (
                contextlib.redirect_stdout(_Lines(log, report)),
                sdk_patched(network_name(job_id)),
                bring.Background([channel]),
            ):
                try:
                    trainer.train(
                        input_data_config=[
                            InputData(channel_name=contract.CODE_CHANNEL, data_source=str(code)),
                            InputData(channel_name=CHECKPOINTS_CHANNEL, data_source=str(staging)),
                            InputData(channel_name=contract.AUTH_CHANNEL, data_source=str(auth)),
                        ],
                        wait=True,
                        logs=True,
                    )
                except RuntimeError as e:  # compose exited non-zero: a container failed
                    failure = failures(root, opts.instance_count) or str(e)
    finally:
        compose_down(compose, root)
    seconds = time.monotonic() - started
    try:  # the containers are gone: the last of the channel, and the model, come home
        channel.once()
        model.once()
        for sync in (channel, model):
            for name in sorted(sync.skipped):
                report(f"left out {name}: not a regular file or directory (a link?)")
            for line in sync.refused:
                report(f"left out {line}")
        if failure is not None:
            write_file(home, contract.FAILURE_FILE, (failure + "\n").encode())
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the token and the CA with it
    return _finish(opts, job_id, home, image.tag, seconds, failure, resumed)


def _finish(
    opts: RunOptions,
    job_id: str,
    home: Path,
    image: str,
    seconds: float,
    failure: str | None,
    resumed: str | None,
) -> RunResult:
    summary = read_json(home / "summary.json") if (home / "summary.json").is_file() else None
    if failure is None and not isinstance(summary, dict):
        failure = "the job ended without a summary.json; see sagemaker.log"
    status = "failed" if failure else "completed"
    if isinstance(summary, dict):
        if summary.get("stopped_by") == "sigterm":
            status = "stopped"
        summary["sagemaker"] = plan.cost(
            opts.instance_type, opts.instance_count, seconds, opts.price_per_hour
        )
        # what is billed (every instance for the whole job), in place of the container's
        # own node-hours of training
        summary["cost"] = plan.comparable_cost(summary["sagemaker"])
        write_file(home, "summary.json", json.dumps(summary, indent=1).encode())
    found = finish(home, None)  # the plots and the summary, as for a job anywhere
    files = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    return RunResult(
        job_id=job_id,
        status=status,
        results=found,
        seconds=seconds,
        image=image,
        failure=failure,
        files=files,
        resumed_from=resumed,
    )


def require_ok(result: RunResult) -> None:
    if result.status == "failed":
        raise OperationError(
            f"SageMaker job {result.job_id} failed: {result.failure}",
            f"read {result.directory / LOG_FILE} (every container's output)",
        )
    if result.status not in ("completed", "stopped"):
        raise InputError(
            f"unknown status {result.status}",
            "a local run ends completed, stopped or failed: report this as a bug",
        )
