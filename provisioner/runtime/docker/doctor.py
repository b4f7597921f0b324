"""The docker runtime's doctor: its facts section (run in the doctor's one round trip), the
parser for it, and its judges, each finding with its fix: Docker installed and running,
usable by the SSH user without sudo (`docker.*`), the pinned image on the node (`image.*`),
the shells (`shell.env`, a warning: Ray runs in the image) and the GPU toolkit
(`runtime/docker/gpu.py`).

The section reads Docker's socket from python3 (a docker CLI call costs ~20 ms, this whole
call less), else the docker CLI, and prints the sections `@@docker`, `@@docker_sudo`,
`@@docker_root`, `@@containers`, `@@image`, `@@docker_runtimes` (read by `gpu.facts`: how
Docker hands GPUs over) and `@@docker_socket`; it sets `runtime_root` to Docker's root, whose
disk the shared `@@disk` section then tells.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from provisioner.checks.facts import Container, NodeFacts, RuntimeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import Plan
from provisioner.inventory import Node
from provisioner.runtime.container_checks import check_versions
from provisioner.runtime.docker.gpu import check_toolkit
from provisioner.runtime.protocol import Judges

ROOT = "/var/lib/docker"  # Docker's root when it does not say

_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "amd64": "amd64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}

# Run inside the doctor's facts script (bash), before its disks are told.
FACTS = resources.files("provisioner.runtime.docker").joinpath("facts.sh").read_text()


@dataclass(frozen=True)
class DockerFacts(RuntimeFacts):
    """What the doctor's round found about the node's Docker."""

    usable: bool = False  # `docker version` answers the SSH user (without sudo)
    remove: str = "docker rm -f"
    version: str = ""  # `docker version`'s answer, or what it said instead
    sudo_version: str = ""  # the same through `sudo -n` (asked only when plain docker fails)
    sudo_ok: bool = False
    socket: str = ""  # `ls -ln /var/run/docker.sock`
    root: str = ""  # DockerRootDir, as Docker said it ("": not said)


def _answer(text: str) -> tuple[str, bool]:
    """A `docker version` section: its text without the `rc=` line, and whether rc was 0."""
    lines = [line for line in text.splitlines() if line.strip()]
    rc = next((line[3:] for line in lines if line.startswith("rc=")), "")
    body = "\n".join(line for line in lines if not line.startswith("rc="))
    return body, rc == "0"


def _containers(text: str) -> tuple[Container, ...]:
    found = []
    for line in text.splitlines():
        if line.strip():
            parts = [*line.split("\t"), "", "", "", ""][:5]
            found.append(Container(*parts))
    return tuple(found)


def parse(sections: Mapping[str, str]) -> DockerFacts:
    """Pure: the node's sections (this runtime's among them) -> Docker's facts."""
    version, version_ok = _answer(sections.get("docker", ""))
    sudo_version, sudo_ok = _answer(sections.get("docker_sudo", ""))
    root = sections.get("docker_root", "")
    return DockerFacts(
        usable=version_ok,
        data_root=root or ROOT,
        containers=_containers(sections.get("containers", "")),
        image=sections.get("image", ""),
        version=version,
        sudo_version=sudo_version,
        sudo_ok=sudo_ok,
        socket=sections.get("docker_socket", ""),
        root=root,
    )


def facts_of(facts: NodeFacts) -> DockerFacts:
    """Docker's facts of a node (none when the round was another runtime's)."""
    return facts.runtime if isinstance(facts.runtime, DockerFacts) else DockerFacts()


def check_docker(node: Node, facts: NodeFacts) -> list[Finding]:
    """Docker is installed, its daemon answers, and the SSH user may use it without sudo."""
    user = node.ssh.user
    f = facts_of(facts)
    if f.usable:
        return [
            ok("docker.daemon", node.name, f"docker {f.version} runs"),
            ok("docker.access", node.name, f"{user} uses docker without sudo"),
        ]
    text = f.version.lower()
    if "command not found" in text:
        return [
            error(
                "docker.daemon",
                node.name,
                "docker is not installed",
                f.version,
                "install Docker Engine (https://docs.docker.com/engine/install/) and start it",
            )
        ]
    if "permission denied" in text:
        evidence = f"{f.version}\nsocket: {f.socket}\ngroups of {user}: {' '.join(facts.groups)}"
        sudo_note = " (works with sudo)" if f.sudo_ok else ""
        return [
            ok(
                "docker.daemon",
                node.name,
                "docker daemon runs" if f.sudo_ok else "docker is installed",
            ),
            error(
                "docker.access",
                node.name,
                f"{user} cannot use docker without sudo{sudo_note}",
                evidence,
                f"sudo usermod -aG docker {user} on {node.name}, then log out and in (or restart "
                "sshd sessions)",
            ),
        ]
    return [
        error(
            "docker.daemon",
            node.name,
            "the docker daemon does not answer",
            f.version,
            "start it: sudo systemctl enable --now docker (or dockerd)",
        )
    ]


def _describe(
    shell_python: str | None, version: str | None, ray: str | None, ray_version: str | None
) -> str:
    py = f"python3 {version} ({shell_python})" if shell_python else "no python3"
    r = f"ray {ray_version or '?'} ({ray})" if ray else "no ray"
    return f"{py}, {r}"


def check_shells(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    """python3 and ray agree between a login shell and `ssh host cmd`: a warning only, since
    Ray runs in the pinned image (the runtimes that run it in a container use this one)."""
    login, plain = f.login, f.plain
    seen_login = _describe(login.python3, login.python3_version, login.ray, login.ray_version)
    seen_plain = _describe(plain.python3, plain.python3_version, plain.ray, plain.ray_version)
    same = (login.python3, login.python3_version, login.ray, login.ray_version) == (
        plain.python3,
        plain.python3_version,
        plain.ray,
        plain.ray_version,
    )
    if same:
        return [ok("shell.env", node.name, f"login and non-interactive shells agree: {seen_plain}")]
    evidence = (
        f"login shell (Ray's launcher): {seen_login}\nssh host cmd: {seen_plain}\n"
        f"PATH login: {login.path}\nPATH plain: {plain.path}"
    )
    where = "~/.bashrc above its 'not interactive' return, or /etc/environment"
    if login.ray and not plain.ray:
        message = (
            "`ray` is on the PATH of a login shell only: "
            "`ssh host ray ...` fails with `ray: command not found`"
        )
        # the directory comes from the node: quoted, so the line can be pasted as it is
        directory = shlex.quote(login.ray.rsplit("/", 1)[0])
        fix = f'put the PATH change (export PATH={directory}:"$PATH") in {where}'
    else:
        message = "python3/ray differ between a login shell and a non-interactive one"
        fix = f"set PATH (and any virtualenv activation) the same way for both: {where}"
    # host mode has its own (runtime/host/): here only the user's own commands are affected
    message += " (Ray runs inside the pinned image: only commands on the host are affected)"
    return [warning("shell.env", node.name, message, evidence, fix)]


def check_image(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    """The runtime holds the pinned image (`RuntimeFacts.image`), built for the node's CPU."""
    if plan.pin is None:
        return []
    held = f.runtime.image
    arch = _ARCH.get(f.arch, f.arch)
    findings = []
    if not held:
        findings.append(
            warning(
                "image.present",
                node.name,
                f"the pinned image {plan.pin.image_id[:19]} is not on this node",
                "",
                "provisioner image push -i INVENTORY (up does it too)",
            )
        )
        image_arch = plan.pin.arch
    else:
        image_id, _, platform = held.partition(" ")
        image_arch = platform.rpartition("/")[2]
        findings.append(ok("image.present", node.name, f"holds the pinned image {image_id[:19]}"))
    if image_arch and arch and _ARCH.get(image_arch, image_arch) != arch:
        findings.append(
            error(
                "image.arch",
                node.name,
                f"the image is built for {image_arch}, the node is {f.arch}",
                f"uname -m: {f.arch}",
                f"build the image for {arch} (or leave this node out)",
            )
        )
    return findings


def node_judges(node: Node, facts: NodeFacts, plan: Plan) -> list[Finding]:
    return [
        *check_docker(node, facts),
        *check_shells(node, facts, plan),
        *check_image(node, facts, plan),
        *check_toolkit(node, facts.gpu),
    ]


def own_ray(facts: NodeFacts, cluster: str) -> bool:
    """This cluster's container runs on the node."""
    return facts.runtime.holds_cluster(cluster, running=True)


# The checks this runtime adds to the doctor's catalogue (`provisioner.doctor.CATALOGUE`).
CHECKS = {
    "docker.daemon": "docker is installed and its daemon runs",
    "docker.access": "the SSH user can use docker without sudo",
}

JUDGES = Judges(
    node=node_judges,
    cluster=check_versions,
    own_ray=own_ray,
    facts=FACTS,
    parse=parse,
    label="Docker",
    checks=CHECKS,
)
