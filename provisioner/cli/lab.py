"""`provisioner lab ...`: a local cluster of simulated nodes, and faults to inject into it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from provisioner.cli.common import JsonOption, output
from provisioner.errors import InputError
from provisioner.inventory.models import DEFAULT_RUNTIME
from provisioner.lab.flavours import DEFAULT_FLAVOUR, parse_flavours

if TYPE_CHECKING:
    from provisioner.lab.nodes import LabInfo

# The lab's modules import the docker SDK (lab.config too, through image.base_image); they are
# imported when a lab command runs, so that every other command starts fast.

app = typer.Typer(
    help="A local lab: N simulated nodes (containers with sshd and dockerd).", no_args_is_help=True
)
fault_app = typer.Typer(
    help="Inject faults into lab nodes (each has its undo).", no_args_is_help=True
)
app.add_typer(fault_app, name="fault")

DEFAULT_LOCK = Path("images") / "image.lock.json"
NameOption = Annotated[
    str | None, typer.Option("--name", help="Lab name (env PROVISIONER_LAB_NAME; default 'lab').")
]
SubnetOption = Annotated[
    str | None,
    typer.Option(
        "--subnet", help="Lab subnet (env PROVISIONER_LAB_SUBNET; default 10.250.0.0/24)."
    ),
]
NodeArg = Annotated[str, typer.Argument(help="Node name, index (0 = head) or address.")]


@app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of nodes (1 head).")] = 3,
    name: NameOption = None,
    subnet: SubnetOption = None,
    image_lock: Annotated[
        Path | None,
        typer.Option(
            "--image-lock",
            help="The image pin the lab's inventory refers to (default: ./images/image.lock.json "
            "when it exists; env PROVISIONER_IMAGE_LOCK).",
            envvar="PROVISIONER_IMAGE_LOCK",
        ),
    ] = None,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="docker: nodes with Docker, for the pinned image; host: nodes with Ray, RLlib "
            "and torch in a virtualenv (from images/requirements.lock and the wheelhouse) on "
            "the login shell's PATH only; podman: nodes with rootless Podman, for the pinned "
            "image, and a login user without Docker or sudo.",
        ),
    ] = DEFAULT_RUNTIME,
    images_dir: Annotated[
        Path,
        typer.Option("--images", help="host: the images directory (lock and wheelhouse)."),
    ] = Path("images"),
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="A SLURM cluster: a login node (slurmctld) and --nodes compute nodes "
            "(slurmd, Ray in a virtualenv as with --runtime host), reached only through the "
            "login node; the inventory asks SLURM for the nodes.",
        ),
    ] = False,
    flavours: Annotated[
        str | None,
        typer.Option(
            "--flavours",
            help="The kind of each node, comma-separated: one for all nodes or one per node "
            "(head first). bookworm: Debian 12, Docker 20.10, Python 3.11; trixie: Debian 13, "
            "Docker 26, Python 3.13; trixie+containerd: trixie with Docker's containerd image "
            "store. --runtime docker or host; with --slurm one flavour for all nodes (bookworm: "
            "Slurm 22.05, trixie: Slurm 24.11); --runtime podman: bookworm (Podman 4.3) or "
            "trixie (Podman 5.4). Default: the lab's own when it is up (a lab up again keeps "
            "its nodes), else bookworm.",
        ),
    ] = None,
    data_subnet: Annotated[
        str | None,
        typer.Option(
            "--data-subnet",
            help="A second network per node, for Ray's traffic: SSH reaches the nodes only on "
            "--subnet, Ray's ports only on this one (iptables in each node); the inventory "
            "gives each node's address here as its `ray: {address}`.",
        ),
    ] = None,
    json_: JsonOption = False,
) -> None:
    """Create (or repair) the lab and write its inventory, key and known_hosts."""
    out = output(json_)
    from provisioner.lab.config import LabConfig

    cfg = LabConfig.from_env(
        name=name,
        subnet=subnet,
        nodes=nodes,
        runtime=runtime,
        slurm=slurm,
        flavours=parse_flavours(flavours) if flavours is not None else _flavours_of(name, nodes),
        data_subnet=data_subnet,
    )
    if image_lock is None and DEFAULT_LOCK.exists():
        image_lock = DEFAULT_LOCK
    from provisioner.lab.nodes import lab_up

    kind = (
        f"SLURM, a login node and {cfg.nodes} compute nodes" if cfg.slurm else f"{cfg.nodes} nodes"
    )
    nets = f"{cfg.subnet} (SSH), {cfg.data_subnet} (Ray)" if cfg.data_subnet else cfg.subnet
    with out.step(f"lab {cfg.name}: {kind} on {nets}"):
        lab = lab_up(cfg, out.progress, image_lock, images_dir)
    if json_:
        out.emit(lab.to_json())
        return
    table = Table("node", "role", "address", "user", "flavour", title=f"lab {lab.name}")
    if cfg.data_subnet:
        table.add_column("Ray address")
    for n in lab.nodes:
        table.add_row(
            n.name,
            n.role,
            n.address,
            n.user,
            n.flavour,
            *([n.data_address] if cfg.data_subnet else []),
        )
    out.out.print(table)
    out.say(f"inventory:   {lab.inventory}\nkey:         {lab.key}\nknown_hosts: {lab.known_hosts}")
    out.say(f"try: provisioner doctor -i {lab.inventory}")


@app.command("down")
def down(name: NameOption = None, json_: JsonOption = False) -> None:
    """Remove every container, network and directory the lab made."""
    out = output(json_)
    from provisioner.lab.config import LabConfig
    from provisioner.lab.nodes import lab_down

    cfg = LabConfig.from_env(name=name)
    removed = lab_down(cfg, out.progress)
    if json_:
        out.emit({"removed": removed})
    else:
        out.say("\n".join(removed) if removed else f"lab {cfg.name}: nothing to remove")


@app.command("status")
def status(name: NameOption = None, json_: JsonOption = False) -> None:
    """Each node's container, sshd and dockerd; exit 1 when any is not healthy."""
    out = output(json_)
    from provisioner.lab import faults
    from provisioner.lab.nodes import info, lab_status, load_config

    cfg = load_config(name)
    lab = info(cfg)
    rows = lab_status(cfg)
    active = [f.key() for f in faults.active(lab)]
    healthy = all(r["container"] == "running" and r["sshd"] and r["dockerd"] for r in rows)
    if json_:
        out.emit({**lab.to_json(), "status": rows, "faults": active, "healthy": healthy})
    else:
        table = Table(
            "node", "address", "flavour", "container", "sshd", "dockerd", title=f"lab {lab.name}"
        )
        for r in rows:
            table.add_row(
                r["name"],
                r["address"],
                r["flavour"],
                r["container"],
                _mark(r["sshd"]),
                _mark(r["dockerd"]),
            )
        out.out.print(table)
        if active:
            out.say("active faults: " + ", ".join(active))
    if not healthy:
        raise typer.Exit(1)


def _flavours_of(name: str | None, nodes: int) -> tuple[str, ...]:
    """The flavours of the lab of that name when it is up (so that `lab up` again keeps its
    nodes as they are), else bookworm; a mixed lab resized names its flavours anew."""
    from provisioner.lab.nodes import load_config

    try:
        recorded = load_config(name)
    except InputError:
        return (DEFAULT_FLAVOUR,)
    if len(recorded.flavours) in (1, nodes + int(recorded.slurm)):
        return recorded.flavours
    raise InputError(
        f"lab {recorded.name!r} has one flavour per node ({','.join(recorded.flavours)}); "
        f"with --nodes {nodes} say which",
        "add --flavours with one entry for all nodes or one per node",
    )


def _lab(name: str | None) -> LabInfo:
    from provisioner.lab.nodes import load_lab

    return load_lab(name)


def _mark(ok: bool) -> Text:
    return Text("ok", style="green") if ok else Text("no", style="red")


def _done(json_: bool, what: str) -> None:
    out = output(json_)
    if json_:
        out.emit({"done": what})
    else:
        out.say(what)


@fault_app.command("stop")
def fault_stop(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Stop a node (power off). Undo: `lab fault start`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.stop(lab, lab.node(node))
    _done(json_, f"stopped {lab.node(node).name}")


@fault_app.command("start")
def fault_start(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Start a stopped node and wait for its sshd and dockerd."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.start(lab, lab.node(node))
    _done(json_, f"started {lab.node(node).name}")


@fault_app.command("cut")
def fault_cut(a: NodeArg, b: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Drop all traffic between two nodes. Undo: `lab fault uncut A B`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.cut(lab, lab.node(a), lab.node(b))
    _done(json_, f"cut {lab.node(a).name} <-> {lab.node(b).name}")


@fault_app.command("uncut")
def fault_uncut(a: NodeArg, b: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Restore traffic between two nodes."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.uncut(lab, lab.node(a), lab.node(b))
    _done(json_, f"restored {lab.node(a).name} <-> {lab.node(b).name}")


@fault_app.command("occupy")
def fault_occupy(
    node: NodeArg, port: int, name: NameOption = None, json_: JsonOption = False
) -> None:
    """Hold a TCP port on a node with a foreign listener. Undo: `lab fault release`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.occupy(lab, lab.node(node), port)
    _done(json_, f"port {port} held on {lab.node(node).name}")


@fault_app.command("release")
def fault_release(
    node: NodeArg, port: int, name: NameOption = None, json_: JsonOption = False
) -> None:
    """Free a port held by `lab fault occupy`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.release(lab, lab.node(node), port)
    _done(json_, f"port {port} released on {lab.node(node).name}")


@fault_app.command("delay")
def fault_delay(node: NodeArg, ms: int, name: NameOption = None, json_: JsonOption = False) -> None:
    """Add latency to every packet a node sends (tc netem). Undo: `lab fault undelay`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.delay(lab, lab.node(node), ms)
    _done(json_, f"{lab.node(node).name}: +{ms} ms")


@fault_app.command("undelay")
def fault_undelay(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Remove added latency."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.undelay(lab, lab.node(node))
    _done(json_, f"{lab.node(node).name}: latency removed")


@fault_app.command("hang")
def fault_hang(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Make a node's sshd accept connections but never answer. Undo: `lab fault unhang`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.hang(lab, lab.node(node))
    _done(json_, f"{lab.node(node).name}: sshd frozen")


@fault_app.command("unhang")
def fault_unhang(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Let a frozen sshd answer again."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.unhang(lab, lab.node(node))
    _done(json_, f"{lab.node(node).name}: sshd answering")


@fault_app.command("clock")
def fault_clock(
    node: NodeArg,
    seconds: Annotated[
        int, typer.Argument(help="Seconds ahead; behind: negative, after `--` (`-- -300`).")
    ],
    name: NameOption = None,
    json_: JsonOption = False,
) -> None:
    """Set a node's clock off, as every SSH session sees it (libfaketime). Undo: `lab fault
    unclock`."""
    from provisioner.lab import faults

    faults.check_clock_offset(seconds)
    lab = _lab(name)
    faults.clock(lab, lab.node(node), seconds)
    _done(json_, f"{lab.node(node).name}: clock {seconds:+d}s")


@fault_app.command("unclock")
def fault_unclock(node: NodeArg, name: NameOption = None, json_: JsonOption = False) -> None:
    """Give a node's SSH sessions the machine's clock again."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.unclock(lab, lab.node(node))
    _done(json_, f"{lab.node(node).name}: clock restored")


AlsoFrom = Annotated[
    list[str] | None,
    typer.Option("--also-from", help="a node whose SSH is dropped too (repeat it)"),
]


@fault_app.command("isolate")
def fault_isolate(
    node: NodeArg, also_from: AlsoFrom = None, name: NameOption = None, json_: JsonOption = False
) -> None:
    """Drop SSH from this machine (and --also-from nodes) to a node; other nodes still reach
    it (try a jump host, or a chain). Undo: `lab fault unisolate` (same --also-from)."""
    from provisioner.lab import faults

    lab = _lab(name)
    others = [lab.node(n) for n in also_from or []]
    faults.isolate(lab, lab.node(node), others)
    _done(json_, f"{lab.node(node).name}: SSH from this machine dropped")


@fault_app.command("unisolate")
def fault_unisolate(
    node: NodeArg, also_from: AlsoFrom = None, name: NameOption = None, json_: JsonOption = False
) -> None:
    """Let SSH from this machine (and --also-from nodes) reach the node again."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.unisolate(lab, lab.node(node), [lab.node(n) for n in also_from or []])
    _done(json_, f"{lab.node(node).name}: SSH from this machine answered again")


@fault_app.command("break")
def fault_break(
    node: Annotated[
        str, typer.Argument(help="Node name, index (0 = head) or address (not with --list).")
    ] = "",
    what: Annotated[
        str, typer.Argument(help="A breakage: `lab fault break --list` names them.")
    ] = "",
    list_: Annotated[bool, typer.Option("--list", help="Name every breakage.")] = False,
    name: NameOption = None,
    json_: JsonOption = False,
) -> None:
    """Break one thing a doctor check looks at on a node (e.g. `gpu`: a SIMULATED GPU node).
    Undo: `lab fault mend NODE WHAT`."""
    from provisioner.lab import faults

    if list_ or not what:
        out = output(json_)
        if json_:
            out.emit({k: v[0] for k, v in faults.BREAKAGES.items()})
        else:
            for key, (text, _, _) in faults.BREAKAGES.items():
                out.say(f"{key}: {text}")
        return
    lab = _lab(name)
    faults.break_node(lab, lab.node(node), what)
    _done(json_, f"{lab.node(node).name}: {what}")


@fault_app.command("mend")
def fault_mend(
    node: NodeArg,
    what: Annotated[str, typer.Argument(help="The breakage to undo.")],
    name: NameOption = None,
    json_: JsonOption = False,
) -> None:
    """Undo `lab fault break NODE WHAT`."""
    from provisioner.lab import faults

    lab = _lab(name)
    faults.mend(lab, lab.node(node), what)
    _done(json_, f"{lab.node(node).name}: {what} mended")


@fault_app.command("clear")
def fault_clear(name: NameOption = None, json_: JsonOption = False) -> None:
    """Undo every fault recorded for the lab."""
    from provisioner.lab import faults

    lab = _lab(name)
    undone = faults.clear(lab)
    _done(json_, "undone: " + (", ".join(f.key() for f in undone) or "nothing"))
