"""Ray from the node's own Python, as people run it from a virtualenv in .bashrc.

Every command runs in a login interactive bash (`bash --login -i -c`, as Ray's own
launcher does), so `ray` is found on the PATH a login shell sets up; or the inventory
names the interpreter (`ray: {python: /opt/venv/bin/python}`). Ray starts detached from
the SSH session (`setsid`) with this cluster's own temp dir (`--temp-dir`: a short
link /tmp/prov-CLUSTER to the node directory `~/.provisioner/clusters/CLUSTER/ray`,
short because Ray's socket paths under it may not exceed 107 bytes), and is stopped by
its processes: the SSH user's own (`ps -u`; never another user's, even as root) whose
environment holds this cluster's id (`PROVISIONER_CLUSTER_ID`, made once in the local
state folder: Ray's processes inherit it), the other processes of the session `up`
started them in, and their descendants (Ray's workers; the dashboard's modules write
their title over their environment, so the session and the descendants matter). A Ray
an older provisioner started (no id in its environment) is known by its temp dir on its
command line, among the user's own processes only. Never `ray stop`: it stops every Ray
on the node, other users' and other clusters' included.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.checks.facts import NodeFacts
from provisioner.gpu.assignment import GpuPlan
from provisioner.gpu.facts import GpuFacts
from provisioner.image.pin import Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import layout, tls
from provisioner.node.commands import ray_start_args
from provisioner.node.token import read_cluster_id
from provisioner.remote.commands import login_shell
from provisioner.runtime.host.doctor import check_host_versions, node_judges
from provisioner.runtime.host.gpu import gpu_env
from provisioner.runtime.protocol import Capabilities, Judges, RayState, RenderSection

if TYPE_CHECKING:
    from provisioner.runtime.delivery_options import PushOptions

START_LOG = "start.log"
STOP_WAIT_S = 15
ID_ENV = "PROVISIONER_CLUSTER_ID"  # in the environment of every Ray process of the cluster


def temp_dir(cluster: str) -> str:
    """This cluster's Ray temp dir on a node, as Ray is given it (a short link)."""
    return layout.node_short_ray_dir(cluster)


def temp_dir_mark(cluster: str) -> str:
    """What every Ray process of this cluster has on its command line (a path fragment)."""
    return f"{layout.node_short_ray_dir(cluster)}/"


def _log(cluster: str) -> str:
    """Shell word: the start log, in the node directory itself (not through the link)."""
    return f"{layout.node_ray_dir(cluster)}/{START_LOG}"


def _interpreter(python: str | None) -> str:
    """Shell lines that set PY to the interpreter Ray runs with (in a login shell)."""
    if python:
        return f'PY={shlex.quote(python)}; export PATH="${{PY%/*}}:$PATH"'
    return (
        'r=$(command -v ray) || { echo "ray: not on the PATH of a login shell" >&2; exit 127; }; '
        'IFS= read -r l <"$r"; PY=${l#\\#!}'
    )


def _env(cluster: str, use_tls: bool = True) -> str:
    """The token by path, no usage stats, where jobs write their results (the node's
    results directory, as the docker runtime mounts it), and with `use_tls` the node's TLS
    files (`node.tls`)."""
    secure = "".join(
        f" {k}={v}" for k, v in tls.ray_env(layout.node_tls_dir(cluster)).items() if use_tls
    )
    return (
        "export RAY_AUTH_MODE=token "
        f"RAY_AUTH_TOKEN_PATH={layout.node_token_path(cluster)} RAY_USAGE_STATS_ENABLED=0 "
        f"{layout.RESULTS_ROOT_ENV}={layout.node_results_dir(cluster)}{secure}"
    )


def _id_env(cluster_id: str) -> str:
    """`NAME=VALUE` marking Ray's processes as this cluster's (quoted; VALUE: 16 hex)."""
    return shlex.quote(f"{ID_ENV}={cluster_id}")


def legacy_temp_dir_mark(cluster: str) -> str:
    """The temp dir Ray was given before it was a short link (the node directory itself):
    a Ray started by an older provisioner is still stopped as this cluster's."""
    return f"/{layout.node_dir(cluster)}/ray/"


def _mark_vars(cluster: str) -> str:
    """awk options whose concatenations `a b` and `c d` are `temp_dir_mark` and the legacy
    mark without the trailing slash; apart, so that no command line of ours (this shell's,
    awk's) holds a mark itself."""
    words = []
    for (x, y), mark in zip(
        (("a", "b"), ("c", "d")),
        (temp_dir_mark(cluster), legacy_temp_dir_mark(cluster)),
        strict=True,
    ):
        head, _, tail = mark.rstrip("/").rpartition("/")
        words.append(f"-v {x}={shlex.quote(head + '/')} -v {y}={shlex.quote(tail)}")
    return " ".join(words)


def _seeds(cluster: str, cluster_id: str) -> str:
    """Shell: L = the SSH user's own processes (`ps -u`: another user's are never ours,
    even to root), SEED = those of this cluster: whose environment holds its id, or (a
    Ray an older provisioner started) whose command line names its temp dir while their
    environment holds no cluster id at all."""
    want = _id_env(cluster_id) if cluster_id else "''"
    return (
        'L=$(ps -u "$(id -u)" -ww -o pid=,ppid=,sid=,args=); '
        f"w={want}; "
        'E=$([ -n "$w" ] && grep -lsxz -e "$w" /proc/[0-9]*/environ | cut -d/ -f3); '
        f'SEED=$(printf "%s\\n" "$L" | awk {_mark_vars(cluster)} -v e="$E" '
        '\'BEGIN { m = a b; l = c d; n = split(e, x, "\\n"); '
        'for (i = 1; i <= n; i++) env[x[i]] = 1 } { line = $0 " " } '
        '($1 in env) { print "y", $1; next } '
        'index(line, m "/") || index(line, m " ") || index(line, l "/") { print "m", $1 }\' | '
        'while read -r k p; do if [ "$k" = y ]; then echo "$p"; '
        f'elif ! grep -qz -e "^{ID_ENV}=" "/proc/$p/environ" 2>/dev/null; then echo "$p"; '
        "fi; done)"
    )


def _pids(cluster: str, cluster_id: str) -> str:
    """Shell: PIDS = this cluster's Ray processes: the SEED (`_seeds`), every process of
    their sessions (`up` starts Ray in a session of its own, so Ray's client server is
    found too; never session 1 nor the stop's own), and every descendant of them (Ray's
    workers rename themselves); the SSH user's own processes only."""
    return (
        'me=$(ps -o sid= -p $$ | tr -d " "); '
        f"{_seeds(cluster, cluster_id)}; "
        'PIDS=$(printf "%s\\n" "$L" | awk -v me="$me" -v seeds="$SEED" '
        '\'BEGIN { n = split(seeds, s, "\\n"); for (i = 1; i <= n; i++) seed[s[i]] = 1 } '
        "{ parent[$1] = $2; sid[$1] = $3 } "
        "($1 in seed) { own[$1] = 1; if ($3 != 1 && $3 != me) ours[$3] = 1 } "
        "END { for (p in sid) if (sid[p] in ours) own[p] = 1; "
        "do { n = 0; for (p in parent) if (!(p in own) && (parent[p] in own)) "
        "{ own[p] = 1; n++ } } while (n); for (p in own) print p }')"
    )


WORKER_START_TRIES = 10  # 3 s apart


def start_command(
    inventory: Inventory,
    node: Node,
    python: str | None,
    gpus: GpuPlan | None = None,
    cluster_id: str = "",
) -> str:
    """Start this cluster's Ray on `node` from the node's own Python, detached, its
    processes marked with `cluster_id` (their environment); `gpus`: the node's GPUs Ray
    may use (CUDA_VISIBLE_DEVICES)."""
    cluster = inventory.cluster
    args = ray_start_args(inventory, node, block=False, gpus=gpus)[2:]  # after `ray start`
    args.append("--temp-dir=TEMPDIR")
    words = " ".join(
        f"--temp-dir={temp_dir(cluster)}" if a == "--temp-dir=TEMPDIR" else shlex.quote(a)
        for a in args
    )
    log = _log(cluster)
    env = gpu_env(gpus) if gpus else {}
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
    tries = 1 if node.role == "head" else WORKER_START_TRIES
    mark = f"export {_id_env(cluster_id)}; " if cluster_id else ""
    script = (
        f"set -e; {_interpreter(python)}; {_env(cluster, inventory.tls)}; {mark}{exports}"
        f"{layout.link_short_ray_dir_command(cluster)}; "
        f"mkdir -p {layout.node_results_dir(cluster)}; "
        f'cd "$HOME"; echo "== $(date -u +%FT%TZ) ray start with $PY" >>{log}; '
        # A worker started with the head may ask the GCS before the head has registered
        # ("No node info found for head node"): no restart policy heals that here, so a
        # worker tries again a few times; the head tries once.
        f"n=0; until setsid -w $PY -m ray.scripts.scripts start {words} </dev/null >>{log} 2>&1; "
        f'do rc=$?; n=$((n+1)); if [ "$n" -ge {tries} ]; then '
        f'tail -n 20 {log} >&2; exit "$rc"; fi; '
        f"echo '== the head is not ready yet; trying again' >>{log}; sleep 3; done"
    )
    return login_shell(script)


def stop_command(cluster: str, cluster_id: str = "") -> str:
    """TERM this cluster's Ray processes, KILL those left after a while; nothing else."""
    pids = _pids(cluster, cluster_id)
    return (
        f'{pids}; [ -z "$PIDS" ] && exit 0; kill -TERM $PIDS 2>/dev/null; '
        f"for i in $(seq {STOP_WAIT_S * 10}); do left=; "
        'for p in $PIDS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done; '
        '[ -z "$left" ] && break; sleep 0.1; done; '
        '[ -n "$left" ] && kill -KILL $left 2>/dev/null && sleep 0.3; '
        f'{pids}; [ -z "$PIDS" ] && exit 0; kill -KILL $PIDS 2>/dev/null; sleep 0.5; '
        f'{pids}; [ -z "$PIDS" ]'
    )


def sockets_command(cluster: str, cluster_id: str = "") -> str:
    """Shell: the inode of every socket held by this cluster's Ray processes (`_pids`:
    the SSH user's own, marked with its id, their sessions and descendants), one a line."""
    return (
        f"{_pids(cluster, cluster_id)}; "
        'for p in $PIDS; do ls -l "/proc/$p/fd/" 2>/dev/null; done | '
        "sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'; exit 0"
    )


def _own_ray(cluster: str, cluster_id: str) -> str:
    """Shell: `raylet=PID` / `gcs=PID` for this cluster's raylet and GCS (of `_seeds`)."""
    return (
        f"{_seeds(cluster, cluster_id)}; "
        'for p in $SEED; do c=$(ps -o comm= -p "$p"); '
        'case "$c" in raylet) echo "raylet=$p";; gcs_server) echo "gcs=$p";; esac; done'
    )


def state_command(cluster: str, cluster_id: str = "") -> str:
    """`raylet=PID`, `gcs=PID`, `session=NAME`, `python=...` lines about this cluster's Ray."""
    return (
        f"{_own_ray(cluster, cluster_id)}; "
        f"d={layout.node_ray_dir(cluster)}; "
        '[ -d "$d" ] && echo "dir=yes"; '
        's=$(ls -d "$d"/session_2* 2>/dev/null | sort | tail -n 1); '
        '[ -n "$s" ] && echo "session=${s##*/}"; '
        f'grep -h "ray start with" "$d"/{START_LOG} 2>/dev/null | tail -n 1 | '
        "sed 's/.* ray start with /python=/'; true"
    )


def parse_state(stdout: str) -> RayState:
    """Pure: `state_command`'s output."""
    values: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep:
            values.setdefault(key, value)
    # No restart policy here: this cluster's Ray runs, or it is gone (old sessions stay
    # on disk as logs).
    status = "running" if "raylet" in values or "gcs" in values else "absent"
    return RayState(status=status, runs=values.get("python"), started_at=values.get("session"))


def running_test(cluster: str, cluster_id: str = "") -> str:
    """Exit 0 when this cluster's raylet or GCS runs (the SSH user's own processes)."""
    return f"{_own_ray(cluster, cluster_id)} | grep -q ."


def python_command(cluster: str, python: str | None, *args: str, use_tls: bool = True) -> str:
    """Run a Python script read from stdin with the interpreter Ray runs with (and the
    environment Ray's processes have: a driver of this cluster)."""
    script = f"{_interpreter(python)}; {_env(cluster, use_tls)}; exec $PY - " + shlex.join(args)
    return login_shell(script)


def log_command(cluster: str, lines: int | None = None) -> str:
    log = _log(cluster)
    return f"tail -n {int(lines)} {log} 2>&1" if lines is not None else f"cat {log} 2>&1"


# Ray from the node's own Python: no container, no image to deliver.
CAPS = Capabilities(containers=False, needs_image=False)


class HostRuntime:
    """Ray from each node's own Python (a virtualenv, a conda env, the system's)."""

    name = "host"
    caps = CAPS
    log_file = "host.log"
    push = "auto"  # nothing to push: the nodes bring their own Ray
    starting = "starting the {role}'s Ray from the node's own Python"
    stopping = "stopping this cluster's Ray processes"

    def __init__(self, inventory: Inventory, pin: Pin | None = None) -> None:
        self.inventory = inventory
        self.cluster = inventory.cluster
        self.python = inventory.ray_python
        self.image_id = ""
        self.cluster_id = read_cluster_id(inventory)  # "" before the first `up`

    def delivery(self, options: PushOptions | None = None) -> None:
        return None  # the nodes bring their own Ray; the doctor checked the versions

    def image_alt_id(self) -> str:
        return ""  # no image

    def state_command(self) -> str:
        return state_command(self.cluster, self.cluster_id)

    def parse_state(self, stdout: str) -> RayState:
        return parse_state(stdout)

    def started_state(self) -> RayState:
        return RayState(status="running", runs=self.python)

    def is_current(self, state: RayState) -> bool | None:
        if self.python is None or state.runs is None:
            return None
        return state.runs == self.python

    def start_command(self, node: Node, gpus: GpuPlan | None = None) -> str:
        return start_command(self.inventory, node, self.python, gpus, self.cluster_id)

    @property
    def judges(self) -> Judges:
        return JUDGES

    @staticmethod
    def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
        return ("host",)  # Ray's own processes see the node's GPUs (CUDA_VISIBLE_DEVICES)

    def gpu_probe_command(self, image: str, gpus: GpuPlan) -> str | None:
        return None  # no image: the doctor's host judges read the node's own stack

    def stop_command(self, node: Node) -> str:
        return stop_command(self.cluster, self.cluster_id)

    def running_test(self) -> str:
        return running_test(self.cluster, self.cluster_id)

    def python_command(self, *args: str) -> str:
        return python_command(self.cluster, self.python, *args, use_tls=self.inventory.tls)

    def sockets_command(self) -> str:
        return sockets_command(self.cluster, self.cluster_id)

    def runtime_log_command(self, lines: int | None = None) -> str:
        return log_command(self.cluster, lines)

    def render_section(self, token_path: Path, tls_dir: Path | None = None) -> RenderSection:
        """Ray's launcher runs these through a login shell too; before `ray start`, this
        cluster's own Ray is stopped (by its temp dir), never with `ray stop`."""
        token = f"~/{layout.node_dir(self.cluster)}/auth_token"
        mounts = {token: str(token_path)}
        secure = ""
        if tls_dir is not None:
            mounts[f"~/{layout.node_dir(self.cluster)}/tls"] = str(tls_dir)
            env_tls = tls.ray_env(layout.node_tls_dir(self.cluster))
            secure = "".join(f"{k}={v} " for k, v in env_tls.items())
        env = (
            f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={layout.node_token_path(self.cluster)} "
            f"RAY_USAGE_STATS_ENABLED=0 "
            f"{layout.RESULTS_ROOT_ENV}={layout.node_results_dir(self.cluster)} "
            + secure
            + (f"{_id_env(self.cluster_id)} " if self.cluster_id else "")
        )
        return RenderSection(
            {"file_mounts": mounts},
            before_start=(
                stop_command(self.cluster, self.cluster_id),
                layout.link_short_ray_dir_command(self.cluster),
            ),
            env=env,
            start_flags=(f"--temp-dir={temp_dir(self.cluster)}",),
        )


def own_ray(facts: NodeFacts, cluster: str) -> bool:
    """A raylet or GCS of this cluster (its temp dir on their command line) runs here; one
    an older provisioner started (the legacy mark) counts too: `up` replaces it."""
    marks = (temp_dir_mark(cluster), legacy_temp_dir_mark(cluster))
    return any(mark in line for line in facts.ray_processes for mark in marks)


# The doctor's judges (`doctor.py`), and its own-Ray waiver, which knows this runtime's
# processes by their temp dir.
JUDGES = Judges(node=node_judges, cluster=check_host_versions, own_ray=own_ray, label="host mode")
RUNTIME = HostRuntime
