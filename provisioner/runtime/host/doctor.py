"""The host runtime's doctor: which Python Ray runs with on each node (the login shell's,
or the inventory's `ray: {python}`), that it has Ray and RLlib, the same versions on
every node (errors: Ray runs with them) and here, and the login-only PATH. Pure judges of
the facts of the doctor's one round; the runtime (`runtime.py`) puts them in its
`JUDGES`."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from packaging.utils import canonicalize_name

from provisioner.checks.facts import NodeFacts, Shell
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import Plan
from provisioner.inventory import Node


def ray_shell(facts: NodeFacts, python: str | None) -> Shell:
    """The interpreter Ray would run with on this node, as the facts tell it."""
    return facts.ray_python if python else facts.login


_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+){0,3}(?:(?:a|b|rc|\.dev|\.post)[0-9]+)*")


def pip_requirement(extra: str, version: str | None) -> str:
    """`"ray[EXTRA]==VERSION"` as one shell word, for a suggested `pip install`; a version
    a node reported that is not a plain release number (node text: anything) is left out,
    so nothing of a node's choosing reaches the command the user is told to run."""
    if version and _VERSION.fullmatch(version):
        return shlex.quote(f"ray[{extra}]=={version}")
    return shlex.quote(f"ray[{extra}]") + " (of the version the head runs)"


def _stack(shell: Shell) -> str:
    return shell.ray_stack or ""


def check_host_python(node: Node, facts: NodeFacts, plan: Plan) -> list[Finding]:
    """Pure: the node has a Python with Ray and RLlib for Ray to run with."""
    shell = ray_shell(facts, plan.ray_python)
    where = (
        f"the inventory's ray.python {plan.ray_python}"
        if plan.ray_python
        else "a login shell's `ray`"
    )
    if not shell.ray_version:
        fix = (
            f"install Ray {plan.control_ray or ''} with RLlib into {plan.ray_python}".replace(
                "  ", " "
            )
            if plan.ray_python
            else "install Ray with RLlib in a virtualenv and activate it from ~/.profile or "
            "~/.bashrc, or name its interpreter in the inventory (ray: {python: PATH})"
        )
        return [
            error(
                "ray.python",
                node.name,
                f"no Ray found for host mode ({where})",
                f"PATH login: {facts.login.path}",
                fix,
            )
        ]
    if "rllib=-" in _stack(shell) or not _stack(shell):
        return [
            error(
                "ray.python",
                node.name,
                f"Ray {shell.ray_version} at {shell.ray_interpreter or shell.ray} has no RLlib",
                f"{shell.ray_interpreter}: {_stack(shell) or 'no RLlib stack'}",
                f"install {pip_requirement('rllib', shell.ray_version)} (and torch) into "
                "that environment",
            )
        ]
    return [
        ok(
            "ray.python",
            node.name,
            f"Ray {shell.ray_version} with Python {shell.ray_python} at "
            f"{shell.ray_interpreter or shell.ray} ({where})",
            _stack(shell),
        )
    ]


def _same_everywhere(
    values: dict[str, str],
    head: str,
    check: str,
    what: str,
    where: dict[str, str],
    fix: Callable[[str, str, str], str] | None = None,
) -> list[Finding]:
    if not values:
        return []
    reference = values.get(head) or max(
        set(values.values()), key=lambda v: list(values.values()).count(v)
    )
    findings = []
    for host, value in values.items():
        if value == reference:
            findings.append(ok(check, host, f"{what} {value}, as on the head"))
            continue
        findings.append(
            error(
                check,
                host,
                f"{what} {value} here ({where.get(host, '?')}), {reference} on the head "
                f"({where.get(head, '?')}): Ray refuses nodes whose versions differ",
                "; ".join(f"{h}: {v}" for h, v in values.items()),
                fix(host, value, reference)
                if fix is not None
                else f"install {what} {reference} into {where.get(host, 'the environment')} on "
                f"{host} (or make every node match this one)",
            )
        )
    return findings


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _python_fix(shells: dict[str, Shell]) -> Callable[[str, str, str], str]:
    """The fix for a node whose Python differs from the head's: a Python is the
    environment itself, so the node needs an environment made from the head's Python
    (its minor release; Debian 12 has 3.11, Debian 13 3.13) with the same Ray."""

    def fix(host: str, value: str, reference: str) -> str:
        minor = ".".join(_major_minor(reference))
        ray = pip_requirement("default,rllib", shells[host].ray_version)
        return (
            f"on {host}, make the environment Ray runs from out of Python {minor}, as on the "
            f"head (a virtualenv from python{minor}, or uv/conda/pyenv where the system "
            f"Python is {value}), install {ray} into it and activate it from ~/.profile "
            "or name it in the inventory (ray: {python: PATH}); or give every node Python "
            f"{'.'.join(_major_minor(value))}"
        )

    return fix


def check_host_versions(facts: dict[str, NodeFacts], plan: Plan) -> list[Finding]:
    """Pure: Python, Ray and RLlib identical on every node, and Ray compatible with the
    control machine's (which submits the jobs)."""
    shells = {host: ray_shell(f, plan.ray_python) for host, f in facts.items()}
    shells = {h: s for h, s in shells.items() if s.ray_version}
    where = {h: s.ray_interpreter or s.ray or "?" for h, s in shells.items()}
    findings = [
        *_same_everywhere(
            {h: s.ray_python or "?" for h, s in shells.items()},
            plan.head,
            "python.version",
            "Python",
            where,
            _python_fix(shells),
        ),
        *_same_everywhere(
            {h: s.ray_version or "?" for h, s in shells.items()},
            plan.head,
            "ray.version",
            "Ray",
            where,
        ),
        *_same_everywhere(
            {h: _stack(s) for h, s in shells.items()}, plan.head, "rllib.version", "RLlib", where
        ),
    ]
    findings += check_host_project(shells, plan)
    head = shells.get(plan.head)
    if head is not None and plan.control_ray and head.ray_version:
        if _major_minor(head.ray_version) != _major_minor(plan.control_ray):
            findings.append(
                error(
                    "ray.control",
                    "local",
                    f"this machine has Ray {plan.control_ray}, the cluster runs Ray "
                    f"{head.ray_version}: jobs submitted from here may be refused or fail",
                    f"local: ray {plan.control_ray}; head {plan.head}: ray {head.ray_version}",
                    f"pip install {pip_requirement('default', head.ray_version)} here, or "
                    f"install Ray {plan.control_ray} on the nodes",
                )
            )
        else:
            findings.append(
                ok(
                    "ray.control",
                    "local",
                    f"Ray {plan.control_ray} here, {head.ray_version} on the cluster",
                )
            )
    return findings


def _pip_word(name: str, version: str) -> str:
    """`name==version` as one shell word, or the name alone when either is not plain."""
    plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)
    if plain and _VERSION.fullmatch(version):
        return f"{name}=={version}"
    return shlex.quote(name) if plain else "the project's packages"


def check_host_project(shells: dict[str, Shell], plan: Plan) -> list[Finding]:
    """Pure: a project's pin (`image build --project`) names its packages and versions:
    every node's Python that Ray runs with has each at that version (so every node
    imports the same code). One finding per node; the fix installs what differs."""
    wanted = plan.pin.project if plan.pin else ()
    if not wanted:
        return []
    findings: list[Finding] = []
    for host, shell in shells.items():
        if shell.ray_dists is None:
            continue  # not told (the facts of an interpreter that would not run)
        off = [
            (name, version, shell.ray_dists.get(canonicalize_name(name)))
            for name, version in wanted
        ]
        off = [o for o in off if o[2] != o[1]]
        interpreter = shell.ray_interpreter or "the Python Ray runs with"
        if not off:
            listed = ", ".join(f"{n} {v}" for n, v in wanted)
            findings.append(ok("project.packages", host, f"the project's {listed}"))
            continue
        said = "; ".join(f"{n} {have or 'missing'} (the pin: {v})" for n, v, have in off)
        others = "; ".join(
            f"{h}: "
            + ", ".join(
                f"{n} {(s.ray_dists or {}).get(canonicalize_name(n), '-')}" for n, _ in wanted
            )
            for h, s in shells.items()
        )
        words = " ".join(_pip_word(n, v) for n, v, _ in off)
        findings.append(
            error(
                "project.packages",
                host,
                f"the project's packages differ here: {said}",
                others,
                f"on {host}: {shlex.quote(interpreter)} -m pip install {words} (the project's "
                "own package: `pip install --no-deps` of its wheel, as `image build --project` "
                "builds it)",
            )
        )
    return findings


def check_host_shell(node: Node, facts: NodeFacts) -> list[Finding]:
    """Host mode runs Ray through a login shell: a `ray` on the login PATH only is what
    the blog post's setup gives, and it works; say so, once, as a warning."""
    login, plain = facts.login, facts.plain
    if login.ray and not plain.ray:
        return [
            warning(
                "shell.env",
                node.name,
                "`ray` is on the PATH of a login shell only: provisioner runs Ray through a "
                "login shell, but `ssh host ray ...` of your own fails",
                f"PATH login: {login.path}\nPATH plain: {plain.path}",
                "nothing to do for provisioner; for your own ssh commands, set PATH in "
                "~/.bashrc above its 'not interactive' return",
            )
        ]
    return []


def node_judges(node: Node, facts: NodeFacts, plan: Plan) -> list[Finding]:
    return [*check_host_python(node, facts, plan), *check_host_shell(node, facts)]
