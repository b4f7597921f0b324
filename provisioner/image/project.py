"""`provisioner image build --project DIR`: the user's project as layers on top of the pin.

DIR holds the user's installable package (`pyproject.toml`) and/or `requirements.txt`. The
Debian packages it needs, if any, are named in pyproject.toml's `[tool.provisioner]` table
(`apt = ["libgeos-c1v5"]`): the one file a Python project already keeps, read with the
standard library's tomllib, with no file of the provisioner's own to learn.

Beneath, the base pin's image is unchanged (Python, Ray, RLlib, torch); on top, in order:
(a) the Debian packages, if any; (b) the project's dependencies, from the project lock
(`DIR/provisioner.lock`: made by pip's resolver with the base lock as constraints, exact
versions and sha256 hashes, kept in DIR so the build repeats), installed offline with
`--require-hashes`; (c) the project's own wheel, built here by pip without its dependencies,
last, so that a change to the project's own code rebuilds and re-pushes only that layer.
The pin (`DIR/image.lock.json` by default) is written last and atomically.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError
from provisioner.image.build import BuildOptions, _docker_build, capture_facts
from provisioner.image.facts import capture_command, with_facts
from provisioner.image.lock import (
    LockedWheel,
    file_sha256,
    index_urls,
    parse_lock,
    pip_download_args,
    run_pip_with_indexes,
    wheels_in,
)
from provisioner.image.pin import Pin, layer_sizes_from_history, write_pin
from provisioner.image.wheelhouse import ensure_wheels
from provisioner.local import build_lock
from provisioner.local import docker_client as client

PROJECT_LOCK = "provisioner.lock"
PYTHON = "/opt/ray/bin/python"  # the image's Python
PROJECT_PIN = "image.lock.json"
REQUIREMENTS = "requirements.txt"
_APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy's package names
_INPUTS = re.compile(r"^# inputs sha256: (?P<sha>[0-9a-f]{64})$", re.MULTILINE)
# A wheel's zip entries carry times: a fixed one makes the same code the same bytes (and
# the same layer), whichever day it is built.
SOURCE_DATE_EPOCH = "315532800"
NOT_SOURCE = ("build", "dist", "*.egg-info", ".git", "__pycache__", ".venv", "results")
# pip quotes a build backend's own output between these two lines
_BACKEND_OUTPUT = re.compile(r"lines of output\]\n(.*?)\n\s*\[end of output\]", re.DOTALL)
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps")


@dataclass(frozen=True)
class Project:
    """What DIR asks for, read from its files (pure: see `parse_project`)."""

    directory: Path
    name: str
    version: str
    has_package: bool  # a pyproject.toml with a [project] table: its own wheel goes in
    requirements: tuple[str, ...]  # the package's dependencies, then requirements.txt's
    apt: tuple[str, ...]


@dataclass(frozen=True)
class Conflict:
    """A requirement the base lock cannot meet."""

    name: str
    wanted: str  # what the project asks for (a specifier, or a locked version)
    base: str  # the base lock's version
    source: str  # where the project asks for it

    def describe(self) -> str:
        return f"{self.source} wants {self.name}{self.wanted}, the base image pins {self.base}"


def _fail(message: str, where: Path | str, fix: str) -> InputError:
    return InputError(message, fix, where=str(where))


def _requirement(line: str, where: str) -> Requirement:
    try:
        return Requirement(line)
    except InvalidRequirement as exc:
        raise _fail(
            f"{line!r} is not a requirement: {exc}",
            where,
            "write one requirement a line, such as `shapely>=2.0` (pip's syntax, no options)",
        ) from None


def parse_requirements_txt(text: str, where: str) -> list[str]:
    """Pure: the requirement lines of a requirements file; options (`-e`, `-r`, URLs) are
    refused: the project lock must name every package by version and hash."""
    out: list[str] = []
    for number, raw in enumerate(text.replace("\\\n", " ").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") or "://" in line:
            raise _fail(
                f"line {number}: {line!r}: only requirements are read here, not pip options "
                "or URLs",
                where,
                "name each package as `name` or `name==version` (an index is pip's "
                "configuration; an editable or local package goes in as the project itself)",
            )
        _requirement(line, f"{where}, line {number}")
        out.append(line)
    return out


def parse_project(directory: Path, pyproject: str | None, requirements_txt: str | None) -> Project:
    """Pure: the project from the text of its pyproject.toml and requirements.txt (None:
    the file is absent)."""
    if pyproject is None and requirements_txt is None:
        raise _fail(
            f"no project here: neither pyproject.toml nor {REQUIREMENTS}",
            directory,
            "pass the directory of an installable package (with pyproject.toml) or of a "
            f"{REQUIREMENTS}; see examples/gridcells",
        )
    name, version, has_package = directory.resolve().name, "0", False
    requirements: list[str] = []
    apt: list[str] = []
    if pyproject is not None:
        where = str(directory / "pyproject.toml")
        try:
            data = tomllib.loads(pyproject)
        except tomllib.TOMLDecodeError as exc:
            raise _fail(f"not TOML: {exc}", where, "fix the file's syntax") from None
        table = data.get("project")
        if table is not None:
            if not isinstance(table, dict) or not isinstance(table.get("name"), str):
                raise _fail(
                    "[project] has no name",
                    where,
                    'give the package a name and version: [project] name = "..." version = "..."',
                )
            name, has_package = table["name"], True
            version = str(table.get("version", "0"))
            deps = table.get("dependencies", [])
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                raise _fail(
                    "[project] dependencies must be a list of requirement strings",
                    where,
                    'write dependencies = ["shapely>=2.0"]',
                )
            for dep in deps:
                _requirement(dep, f"{where}, [project] dependencies")
            requirements += deps
        tool = data.get("tool", {}).get("provisioner", {})
        if not isinstance(tool, dict) or set(tool) - {"apt"}:
            raise _fail(
                "[tool.provisioner] takes one key, apt",
                where,
                'name the Debian packages the project needs: [tool.provisioner] apt = ["..."]',
            )
        listed = tool.get("apt", [])
        if not isinstance(listed, list) or not all(
            isinstance(p, str) and _APT_NAME.fullmatch(p) for p in listed
        ):
            raise _fail(
                f"[tool.provisioner] apt must be a list of Debian package names: {listed!r}",
                where,
                'write apt = ["libgeos-c1v5"] (names only: the base\'s Debian release picks '
                "the versions)",
            )
        apt = list(listed)
    if requirements_txt is not None:
        requirements += parse_requirements_txt(requirements_txt, str(directory / REQUIREMENTS))
    if not has_package and not requirements:
        raise _fail(
            f"the project has neither a package ([project] in pyproject.toml) nor "
            f"requirements ({REQUIREMENTS})",
            directory,
            f"add a [project] table with a name and version, or list packages in {REQUIREMENTS}",
        )
    return Project(directory, name, version, has_package, tuple(requirements), tuple(apt))


def read_project(directory: Path) -> Project:
    if not directory.is_dir():
        raise _fail("no such directory", directory, "pass the project's directory")

    def text(name: str) -> str | None:
        path = directory / name
        return path.read_text() if path.is_file() else None

    return parse_project(directory, text("pyproject.toml"), text(REQUIREMENTS))


def _image_environment() -> dict[str, str]:
    """The marker environment of the image's Python (CPython 3.11, linux x86_64)."""
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(
        python_version="3.11",
        python_full_version="3.11.2",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        os_name="posix",
    )
    return env


def requirement_conflicts(
    project: Project, base: Sequence[LockedWheel], where: str = "the project"
) -> list[Conflict]:
    """Pure: the project's requirements (and its own name) the base lock cannot meet: a
    package the base pins at a version outside the project's specifier."""
    pinned = {canonicalize_name(w.name): w.version for w in base}
    found: list[Conflict] = []
    own = canonicalize_name(project.name)
    if project.has_package and own in pinned:
        found.append(Conflict(project.name, f"=={project.version}", pinned[own], "the package"))
    env = _image_environment()
    for line in project.requirements:
        req = Requirement(line)
        key = canonicalize_name(req.name)
        if key not in pinned or (req.marker is not None and not req.marker.evaluate(env)):
            continue
        if not req.specifier.contains(pinned[key], prereleases=True):
            found.append(Conflict(req.name, str(req.specifier), pinned[key], where))
    return found


def lock_conflicts(locked: Sequence[LockedWheel], base: Sequence[LockedWheel]) -> list[Conflict]:
    """Pure: packages of the project lock the base lock pins at another version."""
    pinned = {canonicalize_name(w.name): w.version for w in base}
    return [
        Conflict(w.name, f"=={w.version}", pinned[canonicalize_name(w.name)], PROJECT_LOCK)
        for w in locked
        if canonicalize_name(w.name) in pinned and pinned[canonicalize_name(w.name)] != w.version
    ]


def refuse_conflicts(conflicts: Sequence[Conflict], where: Path) -> None:
    if conflicts:
        raise _fail(
            "the project conflicts with the base image: "
            + "; ".join(c.describe() for c in conflicts),
            where,
            "the base image's packages (Python, Ray, RLlib, torch, gymnasium and theirs) "
            "are fixed: relax the requirement to admit the base's version, or change "
            "images/requirements.in and rebuild the base",
        )


def inputs_sha256(project: Project, base: Sequence[LockedWheel]) -> str:
    """Pure: what the project lock was made from: the requirements and the base lock."""
    lines = sorted(project.requirements) + ["--"] + [w.requirement() for w in base]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def format_project_lock(wheels: Sequence[LockedWheel], inputs: str) -> str:
    """Pure: the project lock's text: a header with the inputs' hash, then each package the
    base lacks as `name==version --hash=sha256:HEX`, sorted."""
    out = [
        "# The project's own dependencies on top of the base image's lock, made by",
        "# `provisioner image build --project` (pip's resolver, the base lock as constraints).",
        "# Do not edit: change pyproject.toml or requirements.txt and build again.",
        f"# inputs sha256: {inputs}",
    ]
    for w in sorted(wheels, key=lambda w: canonicalize_name(w.name)):
        out.append(f"{w.name}=={w.version} \\\n    --hash=sha256:{w.sha256}")
    return "\n".join(out) + "\n"


def parse_project_lock(text: str, where: str) -> tuple[str | None, list[LockedWheel]]:
    """Pure: the inputs' hash and the packages of a project lock (which may list none)."""
    m = _INPUTS.search(text)
    body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return (m["sha"] if m else None), (parse_lock(text, where) if body else [])


def _resolve(
    project: Project,
    base: Sequence[LockedWheel],
    base_text: str,
    wheelhouse: Path,
    report: Reporter,
) -> list[LockedWheel]:
    """pip's resolver on the project's requirements, constrained to the base lock; the
    wheels the base lacks go into the wheelhouse and are returned."""
    pinned = {canonicalize_name(w.name) for w in base}
    with tempfile.TemporaryDirectory(prefix="provisioner-project-") as tmp:
        constraints = Path(tmp, "constraints.txt")
        constraints.write_text("".join(f"{w.name}=={w.version}\n" for w in base))
        dest = Path(tmp, "wheels")
        try:
            run_pip_with_indexes(
                [*pip_download_args(dest), "-c", str(constraints)],
                "".join(f"{r}\n" for r in project.requirements),
                index_urls(base_text),
                report,
                f"resolving {project.name}'s requirements against the base lock",
            )
        except OperationError as exc:
            raise _fail(
                f"pip cannot resolve the project's requirements with the base image's "
                f"packages: {exc.message}",
                project.directory,
                "a dependency needs another version of a package the base image pins, or "
                "has no wheel for CPython 3.11 on linux x86_64: relax the requirement",
            ) from None
        wheels = [w for w in wheels_in(dest) if canonicalize_name(w.name) not in pinned]
        wheelhouse.mkdir(parents=True, exist_ok=True)
        for w in wheels:
            os.replace(dest / w.filename, wheelhouse / w.filename)
        return wheels


def project_lock(
    project: Project,
    base: Sequence[LockedWheel],
    base_text: str,
    wheelhouse: Path,
    *,
    offline: bool,
    report: Reporter = quiet,
) -> list[LockedWheel]:
    """The project lock: DIR/provisioner.lock when it was made from these requirements and
    this base lock, else made again (pip's resolver) and written."""
    path = project.directory / PROJECT_LOCK
    inputs = inputs_sha256(project, base)
    if path.is_file():
        made_from, locked = parse_project_lock(path.read_text(), str(path))
        if made_from == inputs:
            refuse_conflicts(lock_conflicts(locked, base), path)
            return locked
    if offline:
        raise _fail(
            f"{PROJECT_LOCK} is missing or was made from other requirements or another base",
            path,
            "run `provisioner image build --project DIR` once without --offline where a "
            "package index is reachable, and carry DIR and the wheelhouse here",
        )
    if not project.requirements:
        locked = []
    else:
        locked = _resolve(project, base, base_text, wheelhouse, report)
    refuse_conflicts(lock_conflicts(locked, base), path)
    from provisioner.local import write_output

    write_output(path, format_project_lock(locked, inputs))
    return locked


def build_own_wheel(project: Project, out: Path, report: Reporter = quiet) -> Path:
    """The project's own wheel, built by pip without its dependencies."""
    report(f"building {project.name}'s wheel with pip")
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    # from a copy: pip builds in the tree, and a stale build/ there would go into the wheel
    source = out / "source"
    shutil.copytree(project.directory, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    proc = subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wheels = sorted(out.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        text = proc.stdout + "\n" + proc.stderr
        block = _BACKEND_OUTPUT.search(text)  # what the package's build backend said
        lines = [line.strip() for line in (block[1] if block else text).splitlines()]
        tail = " | ".join([line for line in lines if line][-3:])
        raise _fail(
            f"the project's package does not build: {tail or 'pip made no wheel'}",
            project.directory,
            f"run `pip wheel --no-deps {project.directory}` to see the whole error, fix the "
            "package, and build again",
        )
    return wheels[0]


def dockerfile(apt: Sequence[str], has_deps: bool, has_own: bool) -> str:
    """Pure: the project's Dockerfile on the base pin's image: one layer per part."""
    lines = ["ARG BASE", "FROM ${BASE} AS system"]
    if apt:
        lines += [
            "RUN apt-get update \\",
            " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            + " ".join(apt)
            + " \\",
            " && rm -rf /var/lib/apt/lists/*",
        ]
    pip = "/opt/ray/bin/python -m pip install --no-cache-dir --no-index --no-deps "
    pip += "--ignore-installed --root"
    if has_deps:
        lines += [
            "FROM system AS deps-stage",
            "COPY wheels/ /wheels/",
            "COPY provisioner.lock /provisioner.lock",
            f"RUN {pip} /opt/deps --find-links /wheels --require-hashes --only-binary=:all: "
            "-r /provisioner.lock",
        ]
    if has_own:
        lines += [
            "FROM system AS own-stage",
            "COPY own/ /own/",
            f"RUN {pip} /opt/own /own/*.whl",
        ]
    lines += ["FROM system AS deps"]
    if has_deps:
        lines += ["COPY --from=deps-stage /opt/deps/ /"]
    lines += ["FROM deps AS image"]
    if has_own:
        lines += ["COPY --from=own-stage /opt/own/ /"]
    lines += [
        "ARG PROJECT=unknown",
        'LABEL org.provisioner.project="${PROJECT}"',
    ]
    return "\n".join(lines) + "\n"


def write_project_context(
    project: Project,
    locked_text: str,
    wheels: Sequence[Path],
    own: Path | None,
    out: IO[bytes],
) -> None:
    """The build context as a tar with fixed owners and times, so the build cache holds."""
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add_bytes(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))

        dockerfile_text = dockerfile(project.apt, bool(wheels), own is not None)
        add_bytes("Dockerfile", dockerfile_text.encode())
        add_bytes(PROJECT_LOCK, locked_text.encode())
        for path in wheels:
            add_bytes(f"wheels/{path.name}", path.read_bytes())
        if own is not None:
            add_bytes(f"own/{own.name}", own.read_bytes())


# Inside the image: each project package's version, then `pip check`.
_CHECK = (
    "import importlib.metadata as m, json, subprocess, sys; "
    "names = json.loads(sys.argv[1]); "
    "found = {}\n"
    "for n in names:\n"
    "    try: found[n] = m.version(n)\n"
    "    except m.PackageNotFoundError: found[n] = None\n"
    "c = subprocess.run([sys.executable, '-m', 'pip', 'check'], capture_output=True, text=True)\n"
    "print(json.dumps({'versions': found, 'check': c.returncode, 'out': c.stdout[-600:]}))"
)


def check_inside(image_id: str, names: Sequence[str]) -> dict[str, str | None]:
    """The project's packages' versions inside the image; pip check must pass."""
    try:
        raw = client().containers.run(
            image_id,
            [PYTHON, "-c", _CHECK, json.dumps(list(names))],
            remove=True,
            network_disabled=True,
            stdout=True,
            stderr=False,
        )
    except Exception as exc:  # docker's ContainerError, APIError
        raise OperationError(
            f"the project's image does not run python: {exc}",
            "build the base image again (`provisioner image build`), then the project",
        ) from exc
    data: Any = json.loads(bytes(raw).decode().strip().splitlines()[-1])
    if data["check"] != 0:
        raise OperationError(
            f"`pip check` fails inside the project's image: {data['out'].strip()}",
            f"a dependency is missing from {PROJECT_LOCK}: delete it and build again",
        )
    return {str(k): v for k, v in data["versions"].items()}


@dataclass(frozen=True)
class ProjectOptions:
    project_dir: Path
    base_pin: Pin  # the base image, already built: the project goes on top
    base_lock: Path  # the lock that image was built from
    wheelhouse: Path
    lock_path: Path  # the project's pin
    offline: bool = False
    tag: str = ""  # default: provisioner/ray:project-NAME


@dataclass(frozen=True)
class ProjectResult:
    pin: Pin
    lock_path: Path
    seconds: float
    project_lock: Path


def project_tag(name: str) -> str:
    return f"provisioner/ray:project-{canonicalize_name(name)}"


def project_pin(
    base: Pin,
    image_id: str,
    layers: tuple[str, ...],
    layer_sizes: tuple[int, ...] | None,
    size: int,
    tag: str,
    project: Project,
    packages: Mapping[str, str | None],
    requirements_sha: str,
    has_deps: bool,
) -> Pin:
    """Pure: the project's pin: the image, and in `extra.project` the base pin, the project's
    name, version, packages and which layers are its own."""
    if layers[: len(base.layers)] != base.layers:
        raise OperationError(
            "the project's image does not keep the base image's layers beneath",
            "build again; report it if it repeats",
        )
    mine = layers[len(base.layers) :]
    names = [
        k
        for k, on in (("apt", project.apt), ("deps", has_deps), ("own", project.has_package))
        if on
    ]
    if len(mine) != len(names):
        raise OperationError(
            f"the project's image has {len(mine)} layer(s) on the base, not {len(names)} "
            f"({', '.join(names)})",
            "build again; report it if it repeats",
        )
    parts = dict(zip(names, mine, strict=True))
    return Pin(
        image_id=image_id,
        layers=layers,
        base_image=base.base_image,
        base_image_id=base.base_image_id,
        requirements_sha256=requirements_sha,
        versions=base.versions,
        size=size,
        layer_sizes=layer_sizes,
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        tag=tag,
        extra={
            **base.extra,
            "project": {
                "name": project.name,
                "version": project.version,
                "apt": list(project.apt),
                "packages": dict(packages),
                "layers": parts,
                "base_pin": {
                    "image_id": base.image_id,
                    "tag": base.tag,
                    "layers": len(base.layers),
                    "requirements_sha256": base.requirements_sha256,
                },
            },
        },
    )


def build_project(opts: ProjectOptions, report: Reporter = quiet) -> ProjectResult:
    """Build the project's image on the base pin and write its pin (last, atomically).
    Every check of the input comes before the build."""
    t0 = time.monotonic()
    project = read_project(opts.project_dir)
    base_text = opts.base_lock.read_text()
    base = parse_lock(base_text, str(opts.base_lock))
    refuse_conflicts(requirement_conflicts(project, base), opts.project_dir)
    with build_lock(report):
        try:
            base_id = str(client().images.get(opts.base_pin.tag).id)
        except Exception:  # ImageNotFound, or no engine
            base_id = ""
        if base_id != opts.base_pin.image_id:
            raise InputError(
                f"the base pin's image {opts.base_pin.tag} ({opts.base_pin.short_id()}) is "
                "not on this machine",
                "run `provisioner image build` first (it builds the base and writes its pin)",
                where=str(opts.base_lock.parent / "image.lock.json"),
            )
        locked = project_lock(
            project, base, base_text, opts.wheelhouse, offline=opts.offline, report=report
        )
        wheels = (
            ensure_wheels(
                locked,
                opts.wheelhouse,
                offline=opts.offline,
                indexes=index_urls(base_text),
                report=report,
            )
            if locked
            else []
        )
        locked_text = "".join(f"{w.requirement()}\n" for w in locked)
        with tempfile.TemporaryDirectory(prefix="provisioner-own-") as tmp:
            own = build_own_wheel(project, Path(tmp), report) if project.has_package else None
            tag = opts.tag or project_tag(project.name)
            own_sha = file_sha256(own) if own else ""
            requirements_sha = hashlib.sha256(
                f"{opts.base_pin.requirements_sha256}\n{locked_text}{own_sha}".encode()
            ).hexdigest()
            report(f"building {tag} on {opts.base_pin.short_id()}: {len(locked)} dependencies")
            with tempfile.TemporaryFile(prefix="provisioner-context-") as ctx:
                write_project_context(project, locked_text, wheels, own, ctx)
                ctx.seek(0)
                build_opts = BuildOptions(
                    images_dir=opts.project_dir,
                    wheelhouse=opts.wheelhouse,
                    lock_path=opts.lock_path,
                    base=opts.base_pin.image_id,
                    tag=tag,
                )
                image_id = _docker_build(
                    ctx,
                    build_opts,
                    {
                        "BASE": opts.base_pin.image_id,
                        "PROJECT": f"{project.name}=={project.version}",
                    },
                    report,
                )
        names = [w.name for w in locked] + ([project.name] if project.has_package else [])
        packages = check_inside(image_id, names)
        missing = [n for n, v in packages.items() if v is None]
        if missing:
            raise OperationError(
                f"{', '.join(missing)} not installed in the project's image",
                "build again; report it if it repeats",
            )
        attrs = client().api.inspect_image(image_id)
        layers = tuple(str(d) for d in attrs["RootFS"]["Layers"])
        pin = project_pin(
            opts.base_pin,
            image_id,
            layers,
            layer_sizes_from_history(client().api.history(image_id), layers),
            int(attrs["Size"]),
            tag,
            project,
            packages,
            requirements_sha,
            bool(locked),
        )
        # its own capture (the project's envs), never the base's file
        facts = capture_facts(image_id, capture_command(PYTHON), opts.lock_path, report)
        pin = with_facts(pin, facts)
        write_pin(pin, opts.lock_path)
    return ProjectResult(
        pin, opts.lock_path, time.monotonic() - t0, project.directory / PROJECT_LOCK
    )
