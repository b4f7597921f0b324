"""`provisioner image lock|build|push|show`: the pinned cluster image."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from provisioner.cli.common import InventoryOption, JsonOption, output
from provisioner.console import Output
from provisioner.errors import InputError
from provisioner.image.lock import (
    format_lock,
    index_urls,
    resolve,
    resolve_without_download,
)
from provisioner.image.pin import BUILD_TAG, CLUSTER_TAG, pin_to_dict, read_pin
from provisioner.inventory import load_cluster
from provisioner.local import write_output
from provisioner.runtime.context import cluster_context
from provisioner.runtime.delivery_options import PushOptions

app = typer.Typer(
    help="The pinned cluster image: lock, build, push to every node.", no_args_is_help=True
)

ImagesDirOption = Annotated[
    Path | None,
    typer.Option(
        "--images-dir",
        help="Directory with Dockerfile, requirements.in/.lock (default: ./images).",
        envvar="PROVISIONER_IMAGES_DIR",
    ),
]
WheelhouseOption = Annotated[
    Path | None,
    typer.Option(
        "--wheelhouse",
        help="Where the wheels live (default: IMAGES_DIR/.wheelhouse).",
        envvar="PROVISIONER_WHEELHOUSE",
    ),
]
LockFileOption = Annotated[
    Path | None,
    typer.Option("--lock", help="The pin to write (default: IMAGES_DIR/image.lock.json)."),
]


def _default_images_dir() -> Path:
    # image.build (and with it Docker's SDK, a fifth of a second) only for the image
    # commands: every other command starts without it
    from provisioner.image.build import default_images_dir

    return default_images_dir()


def _dirs(images_dir: Path | None, wheelhouse: Path | None) -> tuple[Path, Path]:
    images = images_dir or _default_images_dir()
    return images, wheelhouse or images / ".wheelhouse"


CudaOption = Annotated[
    bool,
    typer.Option(
        "--cuda",
        help="The CUDA variant: PyTorch with CUDA (requirements-cuda.in/.lock, pin "
        "image-cuda.lock.json); several GB.",
    ),
]


@app.command("lock")
def lock_cmd(
    images_dir: ImagesDirOption = None,
    wheelhouse: WheelhouseOption = None,
    cuda: CudaOption = False,
    download: Annotated[
        bool,
        typer.Option(
            "--download/--no-download",
            help="Keep the resolved wheels in the wheelhouse (default), or only resolve "
            "(default with --cuda: the build fetches the wheels by hash).",
        ),
    ] = True,
    json_: JsonOption = False,
) -> None:
    """Resolve requirements.in with pip into requirements.lock (exact versions and hashes)."""
    out = output(json_)
    images, wheels_dir = _dirs(images_dir, wheelhouse)
    from provisioner.image.build import VARIANTS

    stem = VARIANTS["cuda" if cuda else "cpu"]
    source = images / f"{stem}.in"
    with out.step(f"resolving {source.name}"):
        if download and not cuda:
            wheels = resolve(source, wheels_dir, out.progress)
        else:
            wheels = resolve_without_download(source, out.progress)
    target = images / f"{stem}.lock"
    write_output(target, format_lock(wheels, source.name, index_urls(source.read_text())))
    if json_:
        out.emit({"lock": str(target), "packages": {w.name: w.version for w in wheels}})
    else:
        out.say(f"{target}: {len(wheels)} packages")


# How `image build` came by its base (`--json`: base.how).
BASE_HOW = {
    "given": "--base",
    "built": "the Debian base, built here before",
    "debootstrap": "the Debian base, built now with debootstrap",
    "registry": "FROM $PROVISIONER_BASE_IMAGE",
    "default": "the default base, on this machine",
}


@app.command("build")
def build_cmd(
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="Base image already on this machine (a Debian bookworm image with python3, "
            "e.g. python:3.11-slim-bookworm, pulled by you). Default: the Debian base built "
            "here with debootstrap (as root, offline; once built, every user's), else "
            "python:3.11-slim-bookworm when it is on this machine.",
        ),
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="Never download: the wheelhouse must be complete.")
    ] = False,
    images_dir: ImagesDirOption = None,
    wheelhouse: WheelhouseOption = None,
    lock: LockFileOption = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Local tag of the built image.")] = None,
    cuda: CudaOption = False,
    project: Annotated[
        Path | None,
        typer.Option(
            "--project",
            help="A project directory (pyproject.toml and/or requirements.txt; Debian "
            "packages in [tool.provisioner] apt): its packages go in as layers on the base "
            "pin's image (built first when absent); its lock DIR/provisioner.lock, its pin "
            "DIR/image.lock.json unless --lock.",
        ),
    ] = None,
    json_: JsonOption = False,
) -> None:
    """Build the cluster image offline from the lock and write its pin."""
    out = output(json_)
    images, wheels_dir = _dirs(images_dir, wheelhouse)
    if project is not None:
        _build_project(out, project, images, wheels_dir, lock, base, offline, tag, cuda, json_)
        return
    tag = tag or (f"{BUILD_TAG}-cuda" if cuda else BUILD_TAG)
    chosen = "given"
    if base is None:
        from provisioner.image.base_image import build_base

        choice = build_base(out.progress)
        base, chosen = choice.tag, choice.how
    from provisioner.image.build import BuildOptions, build_image

    opts = BuildOptions(
        images_dir=images,
        wheelhouse=wheels_dir,
        lock_path=lock or images / ("image-cuda.lock.json" if cuda else "image.lock.json"),
        base=base,
        tag=tag,
        offline=offline,
        variant="cuda" if cuda else "cpu",
    )
    with out.step(f"building {tag}"):
        result = build_image(opts, out.progress)
    pin = result.pin
    assert pin is not None
    if json_:
        out.emit(
            {
                **pin_to_dict(pin),
                "lock": str(result.lock_path),
                "seconds": result.seconds,
                "base": {"image": base, "how": chosen},
            }
        )
        return
    v = pin.versions
    out.say(
        f"{pin.image_id}\n  {pin.size / 1e9:.2f} GB, {len(pin.layers)} layers, built in "
        f"{result.seconds:.0f}s\n  python {v.python}, ray {v.ray}, torch {v.torch}, "
        f"gymnasium {v.gymnasium}\n  base: {base} ({BASE_HOW[chosen]})\n  pin: {result.lock_path}"
    )


def _build_project(
    out: Output,
    project: Path,
    images: Path,
    wheels_dir: Path,
    lock: Path | None,
    base: str | None,
    offline: bool,
    tag: str | None,
    cuda: bool,
    json_: bool,
) -> None:
    """`image build --project DIR`: the base pin (built first unless its image is here),
    then the project's layers on it; every check of the project before either build."""
    from provisioner.image.build import VARIANTS, BuildOptions, build_image
    from provisioner.image.lock import parse_lock
    from provisioner.image.project import (
        PROJECT_PIN,
        ProjectOptions,
        build_project,
        read_project,
        refuse_conflicts,
        requirement_conflicts,
    )
    from provisioner.local import docker_client

    base_lock = images / f"{VARIANTS['cuda' if cuda else 'cpu']}.lock"
    if not base_lock.is_file():
        raise InputError(
            "the base image's lock is missing",
            "pass --images-dir pointing at the repository's images/ directory",
            where=str(base_lock),
        )
    spec = read_project(project)
    refuse_conflicts(
        requirement_conflicts(spec, parse_lock(base_lock.read_text(), str(base_lock))), project
    )
    base_pin_path = images / ("image-cuda.lock.json" if cuda else "image.lock.json")
    base_pin = None
    try:
        base_pin = read_pin(base_pin_path)
        if str(docker_client().images.get(base_pin.tag).id) != base_pin.image_id:
            base_pin = None
    except Exception:  # no pin, or its image is not here: build the base
        base_pin = None
    if base_pin is None:
        from provisioner.image.project import build_own_wheel

        # the project's package must build before the base is built for it
        with tempfile.TemporaryDirectory(prefix="provisioner-own-") as tmp:
            if spec.has_package:
                build_own_wheel(spec, Path(tmp), out.progress)
        if base is None:
            from provisioner.image.base_image import build_base

            base = build_base(out.progress).tag
        with out.step("building the base image first"):
            built = build_image(
                BuildOptions(
                    images_dir=images,
                    wheelhouse=wheels_dir,
                    lock_path=base_pin_path,
                    base=base,
                    tag=f"{BUILD_TAG}-cuda" if cuda else BUILD_TAG,
                    offline=offline,
                    variant="cuda" if cuda else "cpu",
                ),
                out.progress,
            )
        assert built.pin is not None
        base_pin = built.pin
    opts = ProjectOptions(
        project_dir=project,
        base_pin=base_pin,
        base_lock=base_lock,
        wheelhouse=wheels_dir,
        lock_path=lock or project / PROJECT_PIN,
        offline=offline,
        tag=tag or "",
    )
    with out.step(f"building the project {spec.name} on {base_pin.short_id()}"):
        result = build_project(opts, out.progress)
    pin = result.pin
    info = pin.extra["project"]
    if json_:
        out.emit(
            {
                **pin_to_dict(pin),
                "lock": str(result.lock_path),
                "project_lock": str(result.project_lock),
                "seconds": result.seconds,
                "base_pin": str(base_pin_path),
            }
        )
        return
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    mine = len(pin.layers) - len(base_pin.layers)
    out.say(
        f"{pin.image_id}\n  {info['name']} {info['version']} on {base_pin.short_id()}: "
        f"{mine} layer(s) of its own ({', '.join(info['layers'])}), built in "
        f"{result.seconds:.0f}s\n  packages: {packages}\n  lock: {result.project_lock}\n"
        f"  pin: {result.lock_path}"
    )


@app.command("push")
def push_cmd(
    inventory: InventoryOption,
    star: Annotated[
        bool,
        typer.Option(
            "--star", help="A star: send once to the head, which sends on to every worker."
        ),
    ] = False,
    chain: Annotated[
        bool,
        typer.Option(
            "--chain",
            help="A chain: send once into a chain of nodes; each streams on what it receives "
            "while loading it (no node sends more than about two images; `up --push chain`).",
        ),
    ] = False,
    old_relay: Annotated[
        bool, typer.Option("--relay", help="Deprecated alias of --star.", show_default=False)
    ] = False,
    old_forward: Annotated[
        bool, typer.Option("--forward", help="Deprecated alias of --chain.", show_default=False)
    ] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Send every layer, even those a node holds.")
    ] = False,
    compress: Annotated[
        str,
        typer.Option(
            "--compress",
            help="auto: compress the layers when the measured link is slower than the "
            "compressor (cached compressed layers are always sent); always; never.",
        ),
    ] = "auto",
    parallel: Annotated[int, typer.Option("--parallel", help="Nodes at once.", min=1)] = 4,
    retries: Annotated[
        int, typer.Option("--retries", help="Retries after a broken stream.", min=0)
    ] = 2,
    lock: LockFileOption = None,
    json_: JsonOption = False,
) -> None:
    """Make every node hold exactly the pinned image under the cluster tag, delivered by
    the inventory's runtime as `up` delivers it (podman: `podman load`)."""
    from provisioner.cluster.deliver import deliver_pin

    out = output(json_)
    inv = load_cluster(inventory)
    out.watch_nodes(n.name for n in inv.nodes)
    lock_path = lock or inv.image_lock
    if lock_path is None:
        raise InputError(
            "the inventory names no image pin (image.lock)",
            "run `provisioner image build`, then set `image: {lock: PATH}` in the inventory "
            "or pass --lock",
            where=str(inventory),
        )
    for used, old, new in ((old_relay, "--relay", "--star"), (old_forward, "--forward", "--chain")):
        if used:
            out.err.print(f"note: {old} is a deprecated alias of {new}", highlight=False)
    star, chain = star or old_relay, chain or old_forward
    if star and chain:
        raise InputError(
            "--star and --chain are two shapes of one push; choose one",
            "--star: the head sends to every worker; --chain: every node sends to the next",
        )
    if compress not in ("auto", "always", "never"):
        raise InputError(
            f"--compress must be auto, always or never, not {compress!r}",
            "auto chooses by the link; never sends the layers as `docker save` writes them",
        )
    cluster = cluster_context(inv, pin_path=lock_path)
    pin = cluster.require_pin()
    opts = PushOptions(
        compress=compress,  # type: ignore[arg-type]
        parallelism=parallel,
        retries=retries,
        star=star,
        chain=chain,
        full=full,
        tag=CLUSTER_TAG,
    )
    with out.step(f"pushing {pin.short_id()} to {len(inv.nodes)} node(s)"):
        report = deliver_pin(cluster, out.progress, options=opts)
    if json_:
        out.emit(report.to_json())
    else:
        table = Table("node", "action", "layers sent", "MB sent", "MB held", "s", "via")
        for n in report.nodes.values():
            table.add_row(
                n.host,
                n.action,
                f"{n.layers_sent}/{n.layers_total}",
                f"{n.bytes_sent / 1e6:,.0f}",
                f"{n.bytes_omitted / 1e6:,.0f}",
                f"{n.seconds:.0f}",
                n.via,
            )
        out.out.print(table)
        out.say(f"sent from this machine: {report.control_bytes / 1e6:,.0f} MB")
        if chain:
            out.say(f"sent by the busiest node: {report.busiest_node_bytes / 1e6:,.0f} MB")
        for host, err in report.errors.items():
            out.err.print(
                f"[bold red]{escape(host)}[/bold red]: {escape(err.message)}",
                markup=True,
                highlight=False,
            )
            if err.fix:
                out.err.print(f"  fix: {err.fix}", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command("show")
def show_cmd(
    lock: Annotated[
        Path | None,
        typer.Argument(help="The pin (default: ./images/image.lock.json).", show_default=False),
    ] = None,
    json_: JsonOption = False,
) -> None:
    """Print the pin: image ID, layers, base, versions."""
    out = output(json_)
    pin = read_pin(lock or _default_images_dir() / "image.lock.json")
    if json_:
        out.emit(pin_to_dict(pin))
        return
    v = pin.versions
    out.say(
        f"{pin.image_id} ({pin.size / 1e9:.2f} GB, {len(pin.layers)} layers)\n"
        f"  base {pin.base_image} ({pin.base_image_id[:19]})\n"
        f"  python {v.python}, ray {v.ray}, torch {v.torch}, gymnasium {v.gymnasium}\n"
        f"  requirements sha256 {pin.requirements_sha256[:16]}, built {pin.built_at}"
    )
    project = pin.extra.get("project")
    if isinstance(project, dict):
        packages = ", ".join(f"{k} {v}" for k, v in dict(project.get("packages", {})).items())
        out.say(
            f"  project {project.get('name')} {project.get('version')} on the base pin "
            f"{str(dict(project.get('base_pin', {})).get('image_id', ''))[:19]}: {packages}"
        )


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="image")
