"""`render --slurm`: a standalone sbatch script that runs a playbook on Ray across the
allocation, for users who submit their own jobs. Nothing of provisioner is needed on the
cluster: the playbook's folder travels inside the script, Ray comes from the nodes' own
Python (a login shell's `ray`, or `ray.python` of the inventory).

What the script does, in order: a port block from the job id (as `provisioner up` on
SLURM does), a private directory of its own, a token for Ray's authentication made for
this job (a 0600 file there), Ray's head on the batch host and a worker on every other
node (srun, each on the address SLURM reaches the node by, each in a private directory
of its own, the token on the step's stdin), a wait until every node has joined, the
playbook as the driver with its results in RESULTS_DIR, and Ray stopped (only this
job's) at the end, its directories removed.

Compute nodes are shared: another user may create any path in /tmp first. So no path
of the job is predictable or reused: each directory is made by `mktemp -d` (exclusive
creation, mode 0700; an existing name is never accepted), then checked to be a
directory of this user, not a link, mode 0700, before anything is written or run from
it (`private_dir` in the script).
"""

from __future__ import annotations

import base64
import gzip
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
STOP_WAIT_S = 20  # for the nodes' Ray to stop at the end, before SLURM kills what is left
RAY_GRACE_S = 8  # for `ray start --block` to exit once signalled (it may hang: then KILL)
# Ray's temp dir is `ray` in the private directory, never the directory itself: Ray makes
# its temp dir and everything in it writable by all (mode 0777), and only the private
# parent (0700) keeps other users out. Ray's socket paths under its temp dir add up to
# 75 bytes (`layout`), and may not exceed 107: so the private directory's path is at
# most 28 bytes, in $TMPDIR when that is short enough, else in /tmp.
RAY_DIR = "ray"
JOB_DIR_MAX = 107 - 75 - len(f"/{RAY_DIR}")
JOB_DIR_NAME = "rayjob-$SLURM_JOB_ID.XXXXXX"  # mktemp's template, in the base directory


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
    tls: bool = True  # Ray's channels under TLS, with a CA of the job's own (`ray: {tls}`)
    # a command started beside the driver, its pid as "$DRIVER_PID" (the watcher of Tune's
    # results, `jobs.watch.watcher_command`, given by `jobs.place.Sbatch`); "" for none
    watch: str = ""


def _driver(job: SbatchJob, args: str) -> str:
    """The playbook as the driver, in a subshell that execs it (its pid, $BASHPID there, is
    $DRIVER_PID), with `job.watch` started beside it; its exit code is the driver's."""
    watch = f"\n  DRIVER_PID=$BASHPID\n  {job.watch} &" if job.watch else ""
    return (
        f'(export PYTHONPATH="$JOB_DIR/playbook${{PYTHONPATH:+:$PYTHONPATH}}"{watch}\n'
        f'  exec "$PY" -u "$JOB_DIR/playbook/"{shlex.quote(job.playbook)} {args})'
    )


def pack_playbook(playbook: Path) -> str:
    """The playbook's folder (its Python files, as a job's working_dir would carry them)
    as base64 of a tar.gz; refused when it would not fit in the script's environment."""
    folder = playbook.resolve().parent
    buf = io.BytesIO()
    # the gzip header's own time is 0 too, so one playbook renders the same script twice
    gz = gzip.GzipFile(fileobj=buf, mode="wb", mtime=0)
    with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
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


def private_dir_function(max_len: int = JOB_DIR_MAX) -> str:
    """Bash: `private_dir` prints a fresh directory that only this user can enter, made
    by `mktemp -d` in $TMPDIR (when it is short enough for Ray's socket paths, and safe:
    this user's or root's, and sticky or writable by its owner alone) or else /tmp, and
    checked before use (a directory, not a link, this user's, mode 0700)."""
    return rf"""private_dir() {{  # a fresh directory only this user can enter, never a known path
  local base d owner mode
  for base in "${{TMPDIR:-}}" /tmp; do
    case $base in /*) ;; *) continue ;; esac
    d="$base/{JOB_DIR_NAME}"
    [ "${{#d}}" -le {max_len} ] && [ -d "$base" ] && [ ! -L "$base" ] || continue
    read -r owner mode < <(stat -c '%u %a' "$base") || continue
    {{ [ "$owner" = 0 ] || [ "$owner" = "$(id -u)" ]; }} || continue
    (( (8#$mode & 8#1000) || !(8#$mode & 8#022) )) || continue  # sticky, or none else writes
    d=$(umask 077 && mktemp -d "$d") || continue
    if [ -d "$d" ] && [ ! -L "$d" ] && [ "$(stat -c '%u %a' "$d")" = "$(id -u) 700" ]; then
      printf '%s\n' "$d"
      return 0
    fi
    echo "ray: $d is not a private directory of $(id -un): not used" >&2
  done
  echo "ray: no private directory in \$TMPDIR or /tmp on $(hostname)" >&2
  return 1
}}"""


# One node's part: its own private directory (Ray's temp dir in it, the playbook's folder
# and the token, which comes on stdin), Ray until the step is signalled, then the
# directory removed.
_NODE_TASK = r"""set -eu
role=$1
IFS= read -r token || { echo "ray: no token on stdin" >&2; exit 1; }
IFS= read -r tls_files || tls_files=
PRIVATE_DIR_FUNCTION
d=$(private_dir)
trap 'rm -rf "$d"' EXIT
stop= pid=
on_signal() {  # the step is stopped: stop Ray (run_ray then exits), or exit now
  stop=1
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; else exit 143; fi
}
trap on_signal TERM INT HUP
echo "ray: $role on $SLURMD_NODENAME in $d" >&2
umask 077
printf '%s\n' "$token" >"$d/auth_token"
unset token
export RAY_AUTH_TOKEN_PATH=$d/auth_token
if [ -n "$tls_files" ]; then  # the job's CA certificate, and its nodes' certificate and key
  mkdir "$d/tls"
  printf %s "$tls_files" | base64 -d | tar -xz -C "$d/tls"
  export RAY_USE_TLS=1 RAY_TLS_SERVER_CERT=$d/tls/node.crt RAY_TLS_SERVER_KEY=$d/tls/node.key \
    RAY_TLS_CA_CERT=$d/tls/ca.crt
fi
unset tls_files
mkdir "$d/playbook"
printf %s "$PLAYBOOK_TGZ" | base64 -d | tar -xz -C "$d/playbook"
addr=$(node_addr "$SLURMD_NODENAME")
export PYTHONPATH="$d/playbook${PYTHONPATH:+:$PYTHONPATH}"
cpus=${SLURM_CPUS_PER_TASK:-$(nproc)}
gpus=()
[ -n "${SLURM_GPUS_PER_NODE:-}" ] && gpus=(--num-gpus="${SLURM_GPUS_PER_NODE##*:}")
run_ray() {  # `ray start --block` until it ends; on a signal, until Ray has stopped
  local rc=0
  "$PY" -m ray.scripts.scripts start --node-ip-address="$addr" --num-cpus="$cpus" \
    "${gpus[@]}" --temp-dir="$d/RAY_DIR" --disable-usage-stats "$@" --block &
  pid=$!
  while :; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break
    if [ -n "$stop" ]; then  # told to stop: Ray's processes had the signal too; give
      for _ in $(seq RAY_GRACE); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true  # `ray start` a few seconds, then no more
    fi
  done
  pid=
  if [ -n "$stop" ]; then
    echo "ray: $role on $SLURMD_NODENAME stopped" >&2
    exit 143
  fi
  return "$rc"
}
if [ "$role" = head ]; then
  run_ray HEAD_FLAGS
  exit
fi
for i in $(seq 10); do  # the head may not have registered yet
  run_ray WORKER_FLAGS && exit 0
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


def _control_chars(text: str) -> list[str]:
    return sorted({repr(c) for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0})


def check_job_text(job: SbatchJob) -> None:
    """Refuse (InputError) a playbook name or argument with a control character: a newline
    would end the script's comment line, or make one argument look like two lines."""
    texts = [("the playbook's file name", job.playbook)]
    texts += [(f"playbook argument {i} ({a[:40]!r})", a) for i, a in enumerate(job.args, 1)]
    for what, text in texts:
        bad = _control_chars(text)
        if bad:
            raise InputError(
                f"{what} holds control characters ({', '.join(bad)}): refused in an sbatch script",
                "pass each argument on one line, without control characters",
            )


def comment_text(text: str) -> str:
    """`text` as it may stand in a script's comment: every control character shown as an
    escape (`\\n`), so that the comment never ends before its line does."""
    return "".join(
        c.encode("unicode_escape").decode() if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c
        for c in text
    )


def _tls_section(on: bool) -> str:
    """Bash: what every node's task reads on stdin (`$JOB_DIR/node_input`: the token's
    line, then the TLS files' line), and with TLS on, those files: a CA of this job's
    own, made on the batch host in the job's private directory (its key removed once
    it has signed), and one certificate for the job's nodes (each node's address,
    127.0.0.1, localhost). Ray's servers then take only clients with a certificate of
    this CA, and its clients check the server's against the address they dialled: the
    token crosses the network inside TLS, and nobody outside the job holds the key."""
    if not on:
        return (
            "# TLS off (`ray: {tls: false}` in the inventory): Ray's traffic is cleartext.\n"
            '(umask 077 && { head -n 1 "$RAY_AUTH_TOKEN_PATH"; echo; } >"$JOB_DIR/node_input")'
        )
    return r"""# TLS: a CA of this job's own and one certificate for its nodes, made here (openssl).
command -v openssl >/dev/null || {
  echo "ray: openssl is needed for Ray's TLS on $(hostname) (or ray: {tls: false})" >&2
  exit 1
}
SANS=IP:127.0.0.1,DNS:localhost
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  a=$(node_addr "$n")
  [ -n "$a" ] || { echo "ray: no address for node $n" >&2; exit 1; }
  SANS=$SANS,IP:$a
done
(umask 077 && mkdir "$JOB_DIR/tls" && cd "$JOB_DIR/tls" &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=ray job $SLURM_JOB_ID CA" -keyout ca.key -out ca.crt 2>/dev/null &&
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=ray job $SLURM_JOB_ID" -keyout node.key -out node.csr 2>/dev/null &&
  printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\n%s\n' "$SANS" \
    extendedKeyUsage=serverAuth,clientAuth >node.ext &&
  openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile node.ext -out node.crt 2>/dev/null &&
  rm -f ca.key ca.srl node.csr node.ext) || {
  echo "ray: making the job's TLS files failed" >&2
  exit 1
}
export RAY_USE_TLS=1 RAY_TLS_SERVER_CERT=$JOB_DIR/tls/node.crt \
  RAY_TLS_SERVER_KEY=$JOB_DIR/tls/node.key RAY_TLS_CA_CERT=$JOB_DIR/tls/ca.crt
(umask 077 && { head -n 1 "$RAY_AUTH_TOKEN_PATH"
  tar -cz -C "$JOB_DIR/tls" ca.crt node.crt node.key | base64 -w0; echo
} >"$JOB_DIR/node_input")"""


def render_sbatch(job: SbatchJob) -> str:
    """The sbatch script (bash). Every value from the inventory or the command line is
    checked or quoted; the payload is base64 (no quote can occur in it)."""
    check_job_text(job)
    directives = "\n".join(f"#SBATCH {d}" for d in sbatch_directives(job.slurm, job.name))
    args = " ".join(shlex.quote(a) for a in job.args)
    node_task = (
        _NODE_TASK.replace("HEAD_FLAGS", _ray_flags(head=True))
        .replace("WORKER_FLAGS", _ray_flags(head=False))
        .replace("PRIVATE_DIR_FUNCTION", private_dir_function())
        .replace("RAY_DIR", RAY_DIR)
        .replace("RAY_GRACE", str(RAY_GRACE_S * 2))
    )
    src = f" from {comment_text(job.source)}" if job.source else ""
    return f"""#!/bin/bash -l
# Rendered by `provisioner render --slurm`{src}:
#   {comment_text(f"{job.playbook} {args}")}
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
# This job's own Ray: a block of ports from the job id, so that other jobs on the same
# nodes never meet it, and on each node a private directory of its own (mktemp, 0700):
# another user on a shared node can neither guess nor pre-create it.
BASE={bash_port_base()}
export BASE
{private_dir_function()}
JOB_DIR=$(private_dir)
export RESULTS_DIR=${{RESULTS_DIR:-$HOME/provisioner-results/$SLURM_JOB_NAME-$SLURM_JOB_ID}}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
# The token: a file of this job (0600), to every node on its step's stdin, never in an
# environment (Ray's processes and the playbook's inherit theirs).
(umask 077 && "$PY" -c 'import secrets; print(secrets.token_hex(32))' >"$JOB_DIR/auth_token")
export RAY_AUTH_TOKEN_PATH=$JOB_DIR/auth_token
export PLAYBOOK_TGZ={job.payload}
(umask 077 && mkdir "$JOB_DIR/playbook" && printf %s "$PLAYBOOK_TGZ" | base64 -d |
  tar -xz -C "$JOB_DIR/playbook")

node_addr() {{  # the address SLURM reaches a node by (NodeAddr), as an IPv4 address
  local a
  a=$(scontrol show node -o "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
  getent ahostsv4 "$a" | awk 'NR == 1 {{print $1}}'
}}
export -f node_addr
{_tls_section(job.tls)}
HEAD_NODE=$SLURMD_NODENAME
HEAD_ADDR=$(node_addr "$HEAD_NODE")
export HEAD_ADDR
export RAY_ADDRESS=$HEAD_ADDR:$((BASE + {OFFSETS["gcs"]}))
NODE_TASK={shlex.quote(node_task)}

STEPS=()
stop_ray() {{  # SIGTERM to the processes of this job's srun steps (not every Ray): each
  # node's `ray start --block` stops its own Ray, then its task removes its directory.
  # (A signal to srun itself would have SLURM kill the tasks at once, leaving them.)
  local steps i p alive
  steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -E '^[0-9]+[.][0-9]+$') || true
  [ -n "$steps" ] && scancel --signal=TERM $steps 2>/dev/null || true
  for i in $(seq {STOP_WAIT_S * 2}); do
    alive=
    for p in "${{STEPS[@]}}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -n "$alive" ] || break
    sleep 0.5
  done
  [ "${{#STEPS[@]}}" -gt 0 ] && kill -TERM "${{STEPS[@]}}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$JOB_DIR"
}}
trap stop_ray EXIT

echo "ray: head on $HEAD_NODE ($RAY_ADDRESS), job dir $JOB_DIR, results $RESULTS_DIR"
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD_NODE" --input=all \\
  bash -c "$NODE_TASK" node head <"$JOB_DIR/node_input" &
STEPS+=($!)
for i in $(seq 600); do
  timeout 1 bash -c "exec 3<>/dev/tcp/$HEAD_ADDR/$((BASE + {OFFSETS["gcs"]}))" 2>/dev/null && break
  sleep 0.5
done
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then
  WORKERS=$((SLURM_JOB_NUM_NODES - 1))
  srun --overlap --nodes=$WORKERS --ntasks=$WORKERS --ntasks-per-node=1 --input=all \\
    --exclude="$HEAD_NODE" bash -c "$NODE_TASK" node worker <"$JOB_DIR/node_input" &
  STEPS+=($!)
fi
"$PY" -c {shlex.quote(_WAIT_NODES)} {JOIN_TIMEOUT_S}

mkdir -p "$RESULTS_DIR"
export PROVISIONER_RESULTS_DIR=$RESULTS_DIR
set +e
{_driver(job, args)}
rc=$?
set -e
echo "driver exited with $rc; results in $RESULTS_DIR"
exit $rc
"""
