"""`render --slurm`: a standalone sbatch script that runs a playbook on Ray across the
allocation, for users who submit their own jobs. Nothing of provisioner is needed on the
cluster: the playbook's folder travels inside the script, Ray comes from the nodes' own
Python (a login shell's `ray`, or `ray.python` of the inventory).

What the script does, in order: a port block and a short temp dir from the job id (as
`provisioner up` on SLURM does), a token for Ray's authentication made for this job, Ray's
head on the batch host and a worker on every other node (srun, each on the address SLURM
reaches the node by), a wait until every node has joined, the playbook as the driver
with its results in RESULTS_DIR, and Ray stopped (only this job's) at the end.
"""

from __future__ import annotations

import base64
import io
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError
from provisioner.inventory.allocation import OFFSETS, bash_port_base
from provisioner.inventory.models import Slurm

PAYLOAD_LIMIT = 96 * 1024  # base64 characters: one environment variable (128 KiB max)
JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class SbatchJob:
    """What the script runs and asks for."""

    name: str  # the job name (the cluster's name)
    slurm: Slurm
    playbook: str  # the playbook's file name in its folder
    args: tuple[str, ...]
    payload: str  # base64 of a tar.gz of the playbook's folder (`pack_playbook`)
    python: str | None = None  # the interpreter; None: a login shell's `ray`
    source: str = ""  # the inventory it came from (a comment)


def pack_playbook(playbook: Path) -> str:
    """The playbook's folder (its Python files, as a job's working_dir would carry them)
    as base64 of a tar.gz; refused when it would not fit in the script's environment."""
    folder = playbook.resolve().parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or any(p.startswith(".") for p in path.parts):
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(folder)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with path.open("rb") as f:
                tar.addfile(info, f)
    text = base64.b64encode(buf.getvalue()).decode()
    if len(text) > PAYLOAD_LIMIT:
        raise InputError(
            f"the playbook's folder {folder} is too large to travel in an sbatch script "
            f"({len(text)} bytes of base64, at most {PAYLOAD_LIMIT})",
            "keep the playbook in a folder of its own (its Python files only)",
        )
    return text


def sbatch_directives(slurm: Slurm, name: str) -> list[str]:
    """The sbatch options that ask for the allocation (one per `#SBATCH` line)."""
    opts = [f"--job-name={name}", f"--nodes={slurm.nodes}", "--ntasks-per-node=1"]
    if slurm.cpus_per_node is not None:
        opts.append(f"--cpus-per-task={slurm.cpus_per_node}")
    if slurm.gpus_per_node:
        opts.append(f"--gpus-per-node={slurm.gpus_per_node}")
    if slurm.partition:
        opts.append(f"--partition={slurm.partition}")
    if slurm.time:
        opts.append(f"--time={slurm.time}")
    if slurm.account:
        opts.append(f"--account={slurm.account}")
    return [*opts, *slurm.extra_sbatch_args]


def _ray_flags(head: bool) -> str:
    """`ray start` port flags from the job's block ($BASE), as bash words."""

    def at(name: str) -> str:
        return f"$((BASE + {OFFSETS[name]}))"

    flags = [
        f"--node-manager-port={at('node_manager')}",
        f"--object-manager-port={at('object_manager')}",
        f"--runtime-env-agent-port={at('runtime_env_agent')}",
        f"--dashboard-agent-grpc-port={at('dashboard_agent_grpc')}",
        f"--dashboard-agent-listen-port={at('dashboard_agent_http')}",
        f"--metrics-export-port={at('metrics_export')}",
        f"--min-worker-port={at('min_worker')}",
        f"--max-worker-port={at('max_worker')}",
    ]
    if head:
        flags = [
            "--head",
            f"--port={at('gcs')}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={at('dashboard')}",
            f"--ray-client-server-port={at('client')}",
            *flags,
        ]
    else:
        flags = [f'--address="$HEAD_ADDR:{at("gcs")}"', *flags]
    return " ".join(flags)


def _interpreter(python: str | None) -> str:
    if python:
        return f"PY={shlex.quote(python)}"
    return (
        'RAY_BIN=$(command -v ray) || { echo "ray: not on the PATH of a login shell" >&2; '
        "exit 127; }\n"
        'IFS= read -r SHEBANG <"$RAY_BIN"; PY=${SHEBANG#\\#!}'
    )


_NODE_TASK = r"""set -eu
role=$1
mkdir -p "$JOB_DIR/playbook"
printf %s "$PLAYBOOK_TGZ" | base64 -d | tar -xz -C "$JOB_DIR/playbook"
addr=$(node_addr "$SLURMD_NODENAME")
export PYTHONPATH="$JOB_DIR/playbook${PYTHONPATH:+:$PYTHONPATH}"
cpus=${SLURM_CPUS_PER_TASK:-$(nproc)}
gpus=()
[ -n "${SLURM_GPUS_PER_NODE:-}" ] && gpus=(--num-gpus="${SLURM_GPUS_PER_NODE##*:}")
if [ "$role" = head ]; then
  exec "$PY" -m ray.scripts.scripts start --node-ip-address="$addr" --num-cpus="$cpus" \
    "${gpus[@]}" --temp-dir="$JOB_DIR/ray" --disable-usage-stats HEAD_FLAGS --block
fi
for i in $(seq 10); do  # the head may not have registered yet
  "$PY" -m ray.scripts.scripts start --node-ip-address="$addr" --num-cpus="$cpus" \
    "${gpus[@]}" --temp-dir="$JOB_DIR/ray" --disable-usage-stats WORKER_FLAGS --block && exit 0
  sleep 3
done
exit 1
"""

_WAIT_NODES = """import os, sys, time
import ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
want = int(os.environ["SLURM_JOB_NUM_NODES"])
deadline = time.monotonic() + float(sys.argv[1])
while True:
    alive = sum(1 for n in ray.nodes() if n["Alive"])
    if alive >= want:
        print(f"ray: {alive} of {want} nodes joined", flush=True)
        break
    if time.monotonic() > deadline:
        sys.exit(f"ray: only {alive} of {want} nodes joined")
    time.sleep(1)
"""


def render_sbatch(job: SbatchJob) -> str:
    """The sbatch script (bash). Every value from the inventory or the command line is
    checked or quoted; the payload is base64 (no quote can occur in it)."""
    directives = "\n".join(f"#SBATCH {d}" for d in sbatch_directives(job.slurm, job.name))
    args = " ".join(shlex.quote(a) for a in job.args)
    node_task = _NODE_TASK.replace("HEAD_FLAGS", _ray_flags(head=True)).replace(
        "WORKER_FLAGS", _ray_flags(head=False)
    )
    src = f" from {job.source}" if job.source else ""
    return f"""#!/bin/bash -l
# Rendered by `provisioner render --slurm`{src}:
#   {job.playbook} {args}
# on Ray across a SLURM allocation. Submit with: sbatch THIS_FILE
# Results: $RESULTS_DIR on the first node of the allocation (the batch host); set
# RESULTS_DIR (e.g. on a shared filesystem) when you submit to put them elsewhere:
#   RESULTS_DIR=/scratch/$USER/run1 sbatch THIS_FILE
# Nothing of provisioner is needed on the cluster: Ray comes from the nodes' own Python
# (a login shell's `ray`), the playbook's folder travels in this file.
{directives}
#SBATCH --output={job.name}-%j.out
set -euo pipefail

{_interpreter(job.python)}
export PY
# This job's own Ray: a block of ports and a short temp dir from the job id, so that
# other jobs on the same nodes never meet it (and socket paths stay under 107 bytes).
BASE={bash_port_base()}
export BASE
export JOB_DIR=/tmp/rayjob-$SLURM_JOB_ID
export RESULTS_DIR=${{RESULTS_DIR:-$HOME/provisioner-results/$SLURM_JOB_NAME-$SLURM_JOB_ID}}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_TOKEN
export PLAYBOOK_TGZ={job.payload}

node_addr() {{  # the address SLURM reaches a node by (NodeAddr), as an IPv4 address
  local a
  a=$(scontrol show node -o "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
  getent ahostsv4 "$a" | awk 'NR == 1 {{print $1}}'
}}
export -f node_addr
HEAD_NODE=$SLURMD_NODENAME
HEAD_ADDR=$(node_addr "$HEAD_NODE")
export HEAD_ADDR
export RAY_ADDRESS=$HEAD_ADDR:$((BASE + {OFFSETS["gcs"]}))
NODE_TASK={shlex.quote(node_task)}

STEPS=()
stop_ray() {{  # SIGTERM to the srun steps: each `ray start --block` stops its own Ray
  [ "${{#STEPS[@]}}" -gt 0 ] && kill -TERM "${{STEPS[@]}}" 2>/dev/null || true
  wait 2>/dev/null || true
}}
trap stop_ray EXIT

echo "ray: head on $HEAD_NODE ($RAY_ADDRESS), temp dir $JOB_DIR/ray, results $RESULTS_DIR"
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD_NODE" bash -c "$NODE_TASK" node head &
STEPS+=($!)
for i in $(seq 600); do
  timeout 1 bash -c "exec 3<>/dev/tcp/$HEAD_ADDR/$((BASE + {OFFSETS["gcs"]}))" 2>/dev/null && break
  sleep 0.5
done
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then
  WORKERS=$((SLURM_JOB_NUM_NODES - 1))
  srun --overlap --nodes=$WORKERS --ntasks=$WORKERS --ntasks-per-node=1 \\
    --exclude="$HEAD_NODE" bash -c "$NODE_TASK" node worker &
  STEPS+=($!)
fi
"$PY" -c {shlex.quote(_WAIT_NODES)} {JOIN_TIMEOUT_S}

mkdir -p "$RESULTS_DIR"
export PROVISIONER_RESULTS_DIR=$RESULTS_DIR
set +e
"$PY" -u "$JOB_DIR/playbook/"{shlex.quote(job.playbook)} {args}
rc=$?
set -e
echo "driver exited with $rc; results in $RESULTS_DIR"
exit $rc
"""
