"""The podman runtime's doctor: its facts section (run in the doctor's one round trip as
the SSH user), the parser for it, and the judges, each finding with its fix: Podman's
version, rootless, the storage driver, cgroups (v2 and the controllers delegated to the
user; a cgroup manager the node runs), subordinate UIDs and GIDs with newuidmap, and
lingering: without it, on a node with systemd-logind, the user's manager stops when the
last SSH session ends, and a rootless container dies with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from provisioner.checks.facts import Container, NodeFacts, RuntimeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import Plan
from provisioner.inventory import Node
from provisioner.runtime.container_checks import check_versions
from provisioner.runtime.docker import doctor as docker_doctor
from provisioner.runtime.podman.delivery import full_id
from provisioner.runtime.podman.gpu import check_cdi
from provisioner.runtime.protocol import Judges

MIN_VERSION = (4, 0)  # rootless --network host, docker-archive loads, CDI
SUBID_MIN = 65536  # an image's files may belong to any UID below 65536
INSTALL = "sudo apt-get install -y podman uidmap (Debian 12: Podman 4.3; Debian 13: 5.4)"


# Run by the doctor's facts script (bash, with its `section`, `lookup` and `with_timeout`,
# and `$image`: the pinned ID), as the SSH user, before its disks are told. The section
# `@@runtime`: lines `%%key=value`, Podman's own `podman info`; it sets `runtime_root` to
# Podman's graph root, whose disk the shared `@@disk` section then tells.
FACTS = r"""
section runtime
{
u=$(id -un); uid=$(id -u)
if lookup podman; then
  echo "%%podman=$REPLY"
  e=$(mktemp)
  info=$(set -o pipefail; with_timeout 30 podman info --format json 2>"$e" | tr -d '\n')
  echo "%%info_rc=$?"; echo "%%info=$info"
  re='"graphRoot": *"([^"]+)"'
  [[ $info =~ $re ]] && runtime_root=${BASH_REMATCH[1]}
  sed 's/^/%%info_msg=/' "$e"; rm -f "$e"
  if [ -n "$image" ]; then
    echo "%%image=$(with_timeout 10 podman image inspect \
      --format '{{.Id}} {{.Os}}/{{.Architecture}}' "${image#sha256:}" 2>/dev/null)"
  fi
  with_timeout 10 podman ps -a --no-trunc \
    --format '{{.Names}}|{{.ImageID}}|{{.State}}|{{index .Labels "provisioner.cluster"}}|{{.ID}}' \
    2>/dev/null | sed 's/^/%%container=/'
fi
lookup newuidmap && echo "%%newuidmap=$REPLY"
for f in /etc/subuid /etc/subgid; do
  [ -r "$f" ] && while IFS= read -r line; do
    case "$line" in "$u:"* | "$uid:"*) echo "%%${f#/etc/}=$line" ;; esac
  done <"$f"
done
echo "%%user=$u $uid"
[ -e "/var/lib/systemd/linger/$u" ] && echo "%%linger=yes" || echo "%%linger=no"
[ -d /run/systemd/system ] && echo "%%systemd=yes" || echo "%%systemd=no"
echo "%%cgroupfs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)"
[ -r /sys/fs/cgroup/unified/cgroup.controllers ] &&
  echo "%%unified=$(cat /sys/fs/cgroup/unified/cgroup.controllers)"
} 2>&1
"""


@dataclass(frozen=True)
class PodmanFacts(RuntimeFacts):
    """What the doctor's round found about the SSH user's Podman on one node (`image`: the
    pin's "sha256:ID os/arch" as Podman holds it; `data_root`: its graph root)."""

    usable: bool = False  # `podman info` answers the SSH user
    remove: str = "podman rm -f"
    podman: str = ""  # its path ("": not on the PATH)
    info: dict[str, Any] = field(default_factory=dict)  # `podman info` ({}: it failed)
    info_rc: int | None = None
    info_messages: tuple[str, ...] = ()  # what `podman info` said besides its answer
    newuidmap: str = ""
    subuid: tuple[tuple[int, int], ...] = ()  # (first, count) ranges for the user
    subgid: tuple[tuple[int, int], ...] = ()
    user: str = ""
    uid: int | None = None
    linger: bool = False
    systemd: bool = False  # the node runs systemd (and so logind ends sessions' processes)
    cgroupfs: str = ""  # cgroup2fs (v2) | tmpfs (v1)
    unified: str | None = None  # v1: the controllers of its cgroup2 mount (hybrid), if any

    def _get(self, *path: str) -> Any:
        value: Any = self.info
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    @property
    def version(self) -> str:
        return str(self._get("version", "Version") or "")

    @property
    def rootless(self) -> bool | None:
        value = self._get("host", "security", "rootless")
        return bool(value) if value is not None else None

    @property
    def graph_driver(self) -> str:
        return str(self._get("store", "graphDriverName") or "")

    @property
    def graph_root(self) -> str:
        return str(self._get("store", "graphRoot") or "")

    @property
    def cgroup_version(self) -> str:
        return str(self._get("host", "cgroupVersion") or "")

    @property
    def cgroup_manager(self) -> str:
        return str(self._get("host", "cgroupManager") or "")

    @property
    def oci_runtime(self) -> str:
        return str(self._get("host", "ociRuntime", "name") or "")

    @property
    def cgroup_controllers(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self._get("host", "cgroupControllers") or ())


def _ranges(lines: list[str]) -> tuple[tuple[int, int], ...]:
    found = []
    for line in lines:
        parts = line.split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((int(parts[1]), int(parts[2])))
    return tuple(found)


def _state(status: str) -> str:
    """`podman ps`'s State as Docker's words: "Up 3 minutes ago" -> running, "Exited (0)
    ..." -> exited, "Created" -> created."""
    first = (status.split() or [""])[0].lower()
    return "running" if first == "up" else first


def parse_facts(text: str) -> PodmanFacts:
    """Pure: the output of FACTS (the doctor's section `runtime`)."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("%%") and "=" in line:
            key, _, value = line[2:].partition("=")
            values.setdefault(key, []).append(value.strip())

    def one(key: str) -> str:
        return values.get(key, [""])[-1]

    info: dict[str, Any] = {}
    if one("info"):
        try:
            loaded = json.loads(one("info"))
            info = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            info = {}
    containers = []
    for line in values.get("container", []):
        name, image, state, cluster, cid = [*line.split("|"), "", "", "", ""][:5]
        containers.append(Container(name, image, _state(state), cluster, cid))
    user, _, uid = one("user").partition(" ")
    rc = one("info_rc")
    root = info.get("store", {}).get("graphRoot") if isinstance(info.get("store"), dict) else ""
    return PodmanFacts(
        usable=bool(info),
        data_root=str(root or ""),
        podman=one("podman"),
        info=info,
        info_rc=int(rc) if rc.isdigit() else None,
        info_messages=tuple(values.get("info_msg", [])),
        image=full_id(one("image")),
        containers=tuple(containers),
        newuidmap=one("newuidmap"),
        subuid=_ranges(values.get("subuid", [])),
        subgid=_ranges(values.get("subgid", [])),
        user=user,
        uid=int(uid) if uid.isdigit() else None,
        linger=one("linger") == "yes",
        systemd=one("systemd") == "yes",
        cgroupfs=one("cgroupfs"),
        unified=values["unified"][-1] if "unified" in values else None,
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def check_podman(node: Node, p: PodmanFacts) -> list[Finding]:
    """Podman is there, answers the SSH user, and is new enough."""
    host = node.name
    if not p.podman:
        return [
            error(
                "podman.version",
                host,
                "podman is not installed (or not on the PATH of `ssh host cmd`)",
                "",
                f"{INSTALL}; or `runtime: docker` in the inventory",
            )
        ]
    if not p.info:
        said = "\n".join(p.info_messages[-5:]) or f"exit status {p.info_rc}"
        return [
            error(
                "podman.rootless",
                host,
                f"`podman info` fails for {node.ssh.user}: rootless Podman cannot start here",
                said,
                "the findings on subordinate IDs (podman.subids) name the usual cause; after "
                "fixing, run `podman system migrate` as the user",
            )
        ]
    found = [
        ok("podman.version", host, f"podman {p.version} ({p.podman})")
        if _version_tuple(p.version) >= MIN_VERSION
        else error(
            "podman.version",
            host,
            f"podman {p.version} is older than {'.'.join(map(str, MIN_VERSION))}",
            f"podman info: version {p.version}",
            f"upgrade Podman: {INSTALL}",
        )
    ]
    if p.rootless:
        found.append(ok("podman.rootless", host, f"rootless as {p.user or node.ssh.user}"))
    else:
        found.append(
            warning(
                "podman.rootless",
                host,
                f"Podman runs rootful: the SSH user is {p.user or '?'} (uid {p.uid})",
                "podman info: host.security.rootless false",
                "log in as an ordinary user (ssh.user in the inventory): rootless Podman "
                "needs no root on the node",
            )
        )
    return found


def check_storage(node: Node, p: PodmanFacts) -> list[Finding]:
    if not p.info:
        return []
    driver, root = p.graph_driver, p.graph_root
    if driver == "vfs":
        return [
            warning(
                "podman.storage",
                node.name,
                "Podman stores images with vfs: every layer is a full copy, so the Ray "
                "image takes several times its size on disk and loads slowly",
                f"podman info: store.graphDriverName vfs, graphRoot {root}",
                'set driver = "overlay" under [storage] in ~/.config/containers/storage.conf '
                "(native overlay needs Linux 5.13 or later, else install fuse-overlayfs), then "
                "`podman system reset` (it removes the user's images and containers)",
            )
        ]
    return [ok("podman.storage", node.name, f"storage driver {driver} at {root}")]


def check_cgroups(node: Node, p: PodmanFacts) -> list[Finding]:
    """cgroup v2 with controllers delegated to the user: Podman can then account and limit
    the container; v1 (or no delegation) runs it, without limits."""
    if not p.info:
        return []
    host = node.name
    seen = (
        f"podman info: cgroupVersion {p.cgroup_version}, cgroupManager {p.cgroup_manager}, "
        f"controllers {' '.join(p.cgroup_controllers) or 'none'}; /sys/fs/cgroup: {p.cgroupfs}"
    )
    if p.cgroup_manager == "systemd" and not p.systemd:
        return [
            error(
                "podman.cgroups",
                host,
                "Podman's cgroup manager is systemd, but the node runs no systemd",
                seen,
                'set cgroup_manager = "cgroupfs" and events_logger = "file" under [engine] '
                "in ~/.config/containers/containers.conf (or /etc/containers/containers.conf)",
            )
        ]
    if p.cgroup_version == "v1" and p.unified and p.oci_runtime == "crun":
        return [
            error(
                "podman.cgroups",
                host,
                "a hybrid cgroup layout (v1, and controllers on the v2 mount) with crun: "
                "every container fails to start (crun: cgroups in hybrid mode not supported)",
                f"{seen}; v2 mount controllers: {p.unified}; OCI runtime crun",
                'install runc (sudo apt-get install -y runc) and set runtime = "runc" under '
                "[engine] in ~/.config/containers/containers.conf (or "
                "/etc/containers/containers.conf); or boot with the unified hierarchy",
            )
        ]
    if p.cgroup_version != "v2":
        return [
            warning(
                "podman.cgroups",
                host,
                "cgroup v1: rootless Podman runs the container without cgroup limits "
                "(Ray's memory monitor still works; --memory and --cpus would not)",
                seen,
                "boot the node with the unified hierarchy (kernel parameter "
                "systemd.unified_cgroup_hierarchy=1; the default since Debian 11)",
            )
        ]
    missing = [c for c in ("cpu", "memory", "pids") if c not in p.cgroup_controllers]
    if missing:
        return [
            warning(
                "podman.cgroups",
                host,
                f"cgroup v2, but the controllers {', '.join(missing)} are not delegated to "
                f"{p.user or node.ssh.user}",
                seen,
                "delegate them: a drop-in /etc/systemd/system/user@.service.d/delegate.conf "
                "with [Service] Delegate=cpu cpuset io memory pids, then `sudo systemctl "
                "daemon-reload` and log in again",
            )
        ]
    return [ok("podman.cgroups", host, f"cgroup v2, {', '.join(p.cgroup_controllers)} delegated")]


def _widest(ranges: tuple[tuple[int, int], ...]) -> int:
    return max((count for _, count in ranges), default=0)


def check_subids(node: Node, p: PodmanFacts) -> list[Finding]:
    """Subordinate UIDs and GIDs for the user, and newuidmap to map them."""
    host = node.name
    user = p.user or node.ssh.user
    if p.uid == 0:
        return []  # rootful: no user namespace of the user's own
    fix_ids = (
        f"sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}, "
        "then `podman system migrate` as the user"
    )
    found: list[Finding] = []
    if not p.newuidmap:
        found.append(
            error(
                "podman.subids",
                host,
                "newuidmap is missing: rootless Podman cannot map the image's users",
                "command -v newuidmap: not found",
                "sudo apt-get install -y uidmap",
            )
        )
    seen = (
        f"/etc/subuid: {', '.join(f'{a}:{n}' for a, n in p.subuid) or 'no range'}; "
        f"/etc/subgid: {', '.join(f'{a}:{n}' for a, n in p.subgid) or 'no range'}"
    )
    lacking = [name for name, r in (("UIDs", p.subuid), ("GIDs", p.subgid)) if not r]
    if lacking:
        found.append(
            error(
                "podman.subids",
                host,
                f"{user} has no subordinate {' or '.join(lacking)}: rootless Podman cannot "
                "run an image whose files belong to other users",
                seen,
                fix_ids,
            )
        )
    elif min(_widest(p.subuid), _widest(p.subgid)) < SUBID_MIN:
        found.append(
            warning(
                "podman.subids",
                host,
                f"{user}'s subordinate ID ranges are narrower than {SUBID_MIN}: an image with "
                "files of higher UIDs fails to load",
                seen,
                fix_ids,
            )
        )
    elif p.newuidmap:
        found.append(ok("podman.subids", host, f"subordinate IDs for {user}: {seen}"))
    return found


def check_linger(node: Node, p: PodmanFacts) -> list[Finding]:
    """Lingering: without it, systemd-logind stops the user's manager when the last SSH
    session ends, and a rootless container (and Ray in it) dies with it."""
    host = node.name
    user = p.user or node.ssh.user
    if p.linger:
        return [ok("podman.linger", host, f"lingering is on for {user}")]
    fix = f"sudo loginctl enable-linger {user} on {node.name}"
    seen = (
        f"/var/lib/systemd/linger/{user}: absent; systemd running: {'yes' if p.systemd else 'no'}"
    )
    if p.systemd:
        return [
            error(
                "podman.linger",
                host,
                f"lingering is off for {user}: Ray's container dies when the SSH session of "
                "`up` ends",
                seen,
                fix,
            )
        ]
    return [
        warning(
            "podman.linger",
            host,
            f"lingering is off for {user}; this node runs no systemd now, so nothing ends "
            "the container at logout, but booted with systemd-logind it would",
            seen,
            fix,
        )
    ]


def check_image(node: Node, facts: NodeFacts, p: PodmanFacts, plan: Plan) -> list[Finding]:
    """The user's Podman holds the pin (under the same ID), built for the node's CPU
    (docker mode's judge, given what Podman holds)."""
    if plan.pin is None:
        return []
    if p.image:
        return docker_doctor.check_image(node, replace(facts, runtime=p), plan)
    return [
        warning(
            "image.present",
            node.name,
            f"the pinned image {plan.pin.image_id[:19]} is not in {node.ssh.user}'s Podman",
            "",
            "provisioner up -i INVENTORY (it loads the pin with `podman load`)",
        )
    ]


def parse(sections: Mapping[str, str]) -> PodmanFacts:
    """Pure: the node's sections -> Podman's facts (its section `runtime`)."""
    return parse_facts(sections.get("runtime", ""))


def facts_of(facts: NodeFacts) -> PodmanFacts:
    """Podman's facts of a node (none when the round was another runtime's)."""
    return facts.runtime if isinstance(facts.runtime, PodmanFacts) else PodmanFacts()


def node_judges(node: Node, facts: NodeFacts, plan: Plan) -> list[Finding]:
    p = facts_of(facts)
    found = check_podman(node, p)
    if p.podman:
        found += [
            *check_storage(node, p),
            *check_cgroups(node, p),
            *check_subids(node, p),
            *check_linger(node, p),
            *check_image(node, facts, p, plan),
        ]
    return [*found, *docker_doctor.check_shells(node, facts, plan), *check_cdi(node, facts.gpu)]


def own_ray(facts: NodeFacts, cluster: str) -> bool:
    """This cluster's container runs in the user's Podman on the node."""
    return facts.runtime.holds_cluster(cluster, running=True)


# The checks this runtime adds to the doctor's catalogue (`provisioner.doctor.CATALOGUE`).
CHECKS = {
    "podman.version": "podman is installed, answers the SSH user, and is 4.0 or newer",
    "podman.rootless": "Podman runs rootless as the SSH user (`podman info` works)",
    "podman.storage": "Podman's storage driver (overlay, not vfs's full copy per layer)",
    "podman.cgroups": "cgroup v2 with cpu, memory and pids delegated to the user; a cgroup "
    "manager the node runs",
    "podman.subids": "subordinate UIDs and GIDs (/etc/subuid, /etc/subgid) and newuidmap",
    "podman.linger": "lingering (`loginctl enable-linger`): the container outlives the SSH session",
}

JUDGES = Judges(
    node=node_judges,
    cluster=check_versions,
    own_ray=own_ray,
    facts=FACTS,
    parse=parse,
    label="Podman",
    checks=CHECKS,
)
