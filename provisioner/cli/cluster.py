"""`provisioner render|up|status|down|logs|tunnel`: the cluster's lifecycle."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.cli.common import InventoryOption, JsonOption, output
from provisioner.console import Output, clean
from provisioner.errors import InputError, ProvisionerError
from provisioner.inventory import Inventory, load_cluster, load_inventory
from provisioner.local import write_output
from provisioner.remote import Pool
from provisioner.runtime.context import ClusterContext, cluster_context
from provisioner.runtime.protocol import PUSH_ALIASES, PUSH_MODES

# Each command imports its own part of the library when it runs: `up` starts connecting
# to the nodes first, and loads the doctor and the rest of itself while they answer (a
# tenth of a second of its start); `down`'s Jobs API client brings asyncio (30 ms).
if TYPE_CHECKING:
    from provisioner.cluster import down as down_mod
    from provisioner.cluster import membership
    from provisioner.cluster import status as status_mod
    from provisioner.cluster.board import Board
    from provisioner.cluster.logs import LogMatch
    from provisioner.cluster.storage import StoreState
    from provisioner.jobs.control import Stopped

ForceOption = Annotated[bool, typer.Option("--force", help="Go on despite doctor errors.")]


def _default_logs_dir(inventory: Inventory) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return inventory.state_dir / "logs" / stamp


def _print_findings(out: Output, findings: list[LogMatch]) -> None:
    if not findings:
        out.say("no known error patterns found")
        return
    table = Table("node", "file:line", "pattern", "cause / fix", title="known errors found")
    for f in findings:
        table.add_row(
            f.node, f"{f.file}:{f.line}", f"{f.pattern} x{f.count}", f"{f.cause}\n{f.fix}"
        )
    out.out.print(table)


def render(
    inventory: InventoryOption,
    out_file: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here (default: stdout).")
    ] = None,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="A standalone sbatch script instead (the inventory's scheduler section): "
            "Ray on every allocated node, PLAYBOOK as the driver, results in a directory.",
        ),
    ] = False,
    playbook: Annotated[
        Path | None, typer.Argument(help="--slurm: the playbook, a Python file.")
    ] = None,
    args: Annotated[
        list[str] | None, typer.Argument(help="--slurm: arguments for the playbook, after `--`.")
    ] = None,
    json_: JsonOption = False,
) -> None:
    """A cluster.yaml for `ray up` (local provider), validated with Ray's own code; or with
    --slurm, an sbatch script that runs PLAYBOOK on Ray across a SLURM allocation.
    With --json: {"kind", "path" (null on stdout), "next", "text" (when not written)}."""
    from provisioner.cluster import render as render_mod

    out = output(json_)
    inv = load_inventory(inventory)
    if slurm or playbook is not None:
        text = _render_sbatch(inv, slurm, playbook, args or [])
        if out_file is not None:
            write_output(out_file, text, mode=0o755)
        _rendered(out, "sbatch", text, out_file, f"sbatch {out_file} (on the cluster's login node)")
        return
    text = render_mod.render_cluster(cluster_context(inv))
    if out_file is not None:
        write_output(out_file, text)
    _rendered(out, "cluster.yaml", text, out_file, f"ray up -y {out_file}")


def _rendered(out: Output, kind: str, text: str, out_file: Path | None, next_: str) -> None:
    """Report what render made: the text on stdout, or where it was written."""
    if out.json_mode:
        doc: dict[str, object] = {"kind": kind, "path": None if out_file is None else str(out_file)}
        if out_file is None:
            doc["text"] = text
        else:
            doc["next"] = next_
        out.emit(doc)
    elif out_file is None:
        out.stdout.write(text)
    else:
        out.progress(f"wrote {out_file}; next: {next_}")


def _render_sbatch(inv: Inventory, slurm: bool, playbook: Path | None, args: list[str]) -> str:
    from provisioner.jobs.place import JobSpec, Sbatch

    if not slurm:
        raise InputError("a PLAYBOOK is rendered only with --slurm", "add --slurm")
    if playbook is None:
        raise InputError("render --slurm needs the PLAYBOOK", "e.g. render --slurm PLAYBOOK.py")
    return Sbatch(inv).script(JobSpec(playbook=playbook, args=tuple(args)))


def up(
    inventory: InventoryOption,
    force: ForceOption = False,
    no_doctor: Annotated[
        bool, typer.Option("--no-doctor", help="Skip the doctor (it runs first by default).")
    ] = False,
    join_timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for every node to join.", min=1)
    ] = 120,
    push: Annotated[
        str,
        typer.Option(
            "--push",
            help="How the image goes: direct (every node from here), chain (this machine "
            "sends once, each node forwards to the next), auto (chain when 2+ nodes lack it); "
            "relay: a deprecated alias of chain.",
        ),
    ] = "auto",
    queue_timeout: Annotated[
        float | None,
        typer.Option(
            "--queue-timeout",
            help="SLURM: give up (and cancel the job) after this many seconds in the queue; "
            "default: wait (Ctrl-C cancels it).",
            min=1,
        ),
    ] = None,
    rotate_token: Annotated[
        bool,
        typer.Option(
            "--rotate-token",
            help="A new token on every node, and every node restarted with it: a Ray that "
            "holds the old one (a node that left the inventory unreached) cannot join. "
            "Running jobs stop.",
        ),
    ] = False,
    json_: JsonOption = False,
) -> None:
    """Doctor, push the pin, start the head and the workers, wait until all joined, probe.

    SLURM (a scheduler section): first a job that holds the allocation (its state and the
    scheduler's reason shown while it waits; Ctrl-C cancels it), then the allocated nodes.

    Exit 0 when every node joined, also with a warning (a node that left the inventory
    could not be reached and keeps the token: the warning names the fix); 1 otherwise."""
    out = output(json_)
    if push in PUSH_ALIASES:
        out.err.print(
            f"note: --push {push} is a deprecated alias of --push {PUSH_ALIASES[push]}",
            highlight=False,
        )
        push = PUSH_ALIASES[push]
    if push not in PUSH_MODES:
        raise InputError(
            f"{push!r} is not a push mode",
            f"use one of: {', '.join(PUSH_MODES)}",
            where="--push",
        )
    inv = load_inventory(inventory)
    cluster = cluster_context(inv, push=push)
    with Pool(inv).warm() as pool:  # the nodes answer while the rest of `up` loads
        from provisioner.cluster import up as up_mod
        from provisioner.cluster.preflight import DoctorStopped

        options = up_mod.UpOptions(
            force=force,
            doctor=not no_doctor,
            join_timeout=join_timeout,
            push=push,
            rotate_token=rotate_token,
            queue_timeout=queue_timeout,
        )
        try:
            result, slurm_job = up_mod.up_cluster(
                cluster,
                out.progress,
                options=options,
                on_nodes=lambda held: out.watch_nodes(n.name for n in held.nodes),
                pool=pool,
            )
        except DoctorStopped as stopped:
            if json_:
                out.emit({"stopped_by": "doctor", "doctor": stopped.preflight.to_json()})
            else:
                from provisioner.cli.doctor import render as render_findings

                render_findings(out, stopped.preflight.report, show_ok=False)
                out.err.print(
                    f"[bold red]up stopped:[/bold red] {escape(stopped.fix or '')}", markup=True
                )
            raise typer.Exit(1) from None
    _warn(out, result.warnings)
    if json_:
        out.emit({**result.to_json(), "slurm_job": slurm_job})
        return
    if slurm_job is not None:
        out.say(f"SLURM job {slurm_job} holds the nodes until `provisioner down`")
    t = result.totals
    if result.departed:
        _say_departed(out, result.departed)
    if result.token.rotate:
        out.say(
            f"token rotated ({result.token.why}): every node restarted with the new one; "
            "a Ray holding the old token cannot join"
        )
    if not result.changed:
        out.say("the cluster was already up; nothing changed")
    else:
        out.say(f"started: {', '.join(result.started)}")
    out.say(
        f"{int(t.get('nodes', 0))} nodes, {t.get('cpus', 0):g} CPUs, "
        f"{t.get('memory_gib', 0):g} GiB memory, {t.get('gpus', 0):g} GPUs "
        f"in {result.seconds:.1f}s"
    )
    if result.withheld:
        held = ", ".join(f"{n} ({w.count})" for n, w in sorted(result.withheld.items()))
        out.say(
            "GPUs not given to Ray (the image's torch cannot use them, see the warning): " + held
        )
    status = result.status
    out.say(f"Ray address: {status.address if status else ''} (token authentication on)")
    out.say(f"dashboard: provisioner tunnel -i {inventory}")


def _warn(out: Output, warnings: list[str]) -> None:
    """Warnings on stderr, in --json mode too (the document carries them as `warnings`)."""
    for warning in warnings:
        out.err.print(f"warning: {warning}")


def _say_departed(out: Output, removal: membership.Removal) -> None:
    for node in removal.nodes:
        if node.name in removal.errors:
            out.say(
                f"{node.name} ({node.address}) left the inventory, but this cluster's Ray could "
                f"not be removed there: {removal.errors[node.name]} (the next up or down retries)"
            )
        else:
            out.say(f"{node.name} ({node.address}) left the inventory: this cluster's Ray removed")


def _cell(text: str) -> Text:
    """Node text as it is: no markup, no emoji codes (an IPv6 address holds `:1234:`),
    control characters shown."""
    return Text(clean(text))


def _ray_cell(n: status_mod.NodeStatus) -> str:
    if not n.ssh_ok:
        return "no SSH"
    if n.ray_alive:
        return "alive"
    return n.container or "-"


def status_table(st: status_mod.ClusterStatus) -> Table:
    """Pure: the human status table; readable at 80 columns (names and addresses wrap,
    never cut), each unhealthy node with its reason."""
    image = st.caps.needs_image  # the node runs the pinned image: is it the pinned one
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    table.add_column("node / address", overflow="fold", min_width=13)
    table.add_column("role", no_wrap=True)
    table.add_column("ray", no_wrap=True)
    table.add_column("image" if image else "current", no_wrap=True)
    table.add_column("CPUs", justify="right", no_wrap=True)
    table.add_column("problem", overflow="fold", ratio=1, min_width=20)
    for n in st.nodes:
        where = n.name if n.name == n.host else f"{n.name}\n{n.host}"
        table.add_row(
            _cell(where),
            n.role,
            _ray_cell(n),
            {True: "ok", False: "WRONG", None: "-"}[n.image_ok],
            f"{n.resources.get('CPU', 0):g}",
            _cell(n.reason or ("" if n.healthy else "unhealthy")),
        )
    for g in st.outside:
        table.add_row(
            _cell(g.ip),
            "?",
            "alive",
            "-",
            f"{g.resources.get('CPU', 0):g}",
            _cell("in this cluster but not in the inventory: `provisioner up` removes it"),
        )
    return table


def _store_state(inv: Inventory) -> StoreState | None:
    """The head's store (address, bytes used), when this cluster records one."""
    from provisioner.cluster import storage

    if storage.read_store(inv) is None or not inv.allocated:
        return None
    try:
        with Pool(inv) as pool:
            return storage.state(inv, pool.session(inv.head))
    except ProvisionerError:
        return None


def status(inventory: InventoryOption, json_: JsonOption = False) -> None:
    """Each node's SSH, container, image and Ray liveness; exit 1 when unhealthy.
    SLURM: the job's state, nodes and time left too (a warning when the limit is near)."""
    from provisioner.cluster import status as status_mod

    out = output(json_)
    inv = load_inventory(inventory)
    st, job = status_mod.status_cluster(cluster_context(inv), out.progress)
    store = _store_state(inv)
    if json_:
        out.emit(
            {
                **st.to_json(),
                "storage": store.to_json() if store is not None else None,
                **({"slurm": job.to_json()} if job is not None else {}),
            }
        )
    else:
        table = status_table(st)
        out.out.print(table)
        out.say(f"{st.alive_nodes}/{st.expected_nodes} nodes alive at {st.address}")
        if store is not None:
            out.say(store.line())
        if st.outside:
            out.say(
                f"{len(st.outside)} node(s) in this cluster that the inventory does not list: "
                f"{', '.join(g.ip for g in st.outside)} (`provisioner up` removes them)"
            )
        if st.gcs_error:
            out.say(f"GCS: {st.gcs_error}")
    if not st.healthy or (job is not None and not job.running):
        raise typer.Exit(1)


def down(
    inventory: InventoryOption,
    no_logs: Annotated[bool, typer.Option("--no-logs", help="Do not collect logs first.")] = False,
    logs_dir: Annotated[Path | None, typer.Option("-o", "--logs-dir")] = None,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Stop running jobs (their results come home first)."),
    ] = False,
    results: Annotated[
        Path, typer.Option("--results", help="Where a stopped job's results/JOB/ goes.")
    ] = Path("results"),
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Also remove the head's store's data (Tune's results and checkpoints there).",
        ),
    ] = False,
    json_: JsonOption = False,
) -> None:
    """Collect logs, stop workers then the head, remove containers, check ports are free.

    With a job running: refuses, unless --yes (the job is stopped and its results come home
    first). Then the head's store stops; its data stays for the next `up` unless --purge.
    Exit 1 when an inventory node's Ray could not be removed; a node that left the
    inventory and could not be reached is a warning (exit 0): the next `up` changes the token."""
    from provisioner.cluster import down as down_mod

    out = output(json_)
    inv = load_inventory(inventory)
    cluster = cluster_context(inv, with_pin=False)  # stopping Ray needs no pin
    stopped: list[Stopped] = []

    def on_nodes(held: Inventory) -> None:
        out.watch_nodes(n.name for n in held.nodes)
        stopped.extend(_stop_jobs(cluster.on(held), results, yes, out))

    target = None if no_logs else (logs_dir or _default_logs_dir(inv))
    result = down_mod.down_cluster(
        cluster, out.progress, logs_dir=target, on_nodes=on_nodes, purge=purge
    )
    if result.queued_only:  # a job still queued, or none: nothing ran on any node
        _say_queued(out, result, json_)
        return
    slurm = result.slurm.to_json() if result.slurm is not None else {}
    _warn(out, result.warnings)
    if json_:
        out.emit(
            {
                **result.to_json(),
                "jobs_stopped": [s.to_json() for s in stopped],
                **({"slurm": slurm} if slurm else {}),
            }
        )
    else:
        if result.logs:
            if result.logs.nodes:  # a folder with no node's logs is not kept, nor named
                out.say(f"logs: {result.logs.directory}")
            for name, err in result.logs.errors.items():
                out.say(f"{name}: logs not collected: {err}")
        out.say(f"removed Ray from: {', '.join(result.removed) or 'no node'}")
        if result.departed:
            _say_departed(out, result.departed)
        for name, busy in result.ports_busy.items():
            out.say(f"{name}: Ray ports still in use: {busy}")
        for name, err in result.errors.items():
            out.say(f"{name}: {err}")
    if not result.ok:
        raise typer.Exit(1)


def _say_queued(out: Output, result: down_mod.DownResult, json_: bool) -> None:
    """down before the allocation ran: the recorded job cancelled, if any."""
    assert result.slurm is not None
    job_id, gone = result.slurm.job_id, result.slurm.left_queue
    if json_:
        out.emit({"removed": [], "slurm": result.slurm.to_json()})
    else:
        out.say(f"SLURM job {job_id} cancelled" if job_id else "no SLURM job recorded")
    if not gone:
        raise typer.Exit(1)


def _stop_jobs(cluster: ClusterContext, results: Path, yes: bool, out: Output) -> list[Stopped]:
    """The cluster's running jobs, stopped with --yes; nothing when its Jobs API is gone."""
    from provisioner.jobs.control import JobsRunning, stop_for_down
    from provisioner.jobs.link import Target
    from provisioner.node import token

    inv = cluster.inventory
    try:
        with Target(inv, None, token.local_token_path(inv), cluster).link() as link:
            return stop_for_down(link, results, yes=yes, report=out.progress)
    except JobsRunning:
        raise
    except ProvisionerError as exc:
        out.progress(f"no running jobs checked: {exc}")
        return []


def logs(
    inventory: InventoryOption,
    out_dir: Annotated[Path | None, typer.Option("-o", "--output", help="Directory.")] = None,
    json_: JsonOption = False,
) -> None:
    """Every node's Ray session logs and container log into DIR/NODE/; known errors named."""
    from provisioner.cluster.logs import collect

    out = output(json_)
    inv = load_cluster(inventory)
    runtime = cluster_context(inv).runtime
    out.watch_nodes(n.name for n in inv.nodes)
    target = out_dir or _default_logs_dir(inv)
    with Pool(inv) as pool:
        got = collect(inv, pool, out.progress, directory=target, runtime=runtime)
    if json_:
        out.emit(got.to_json())
    else:
        if got.nodes:
            out.say(f"logs of {', '.join(got.nodes)} in {got.directory}")
        else:  # and no empty folder left
            out.say("no node's logs collected")
        for name, err in got.errors.items():
            out.say(f"{name}: {err}")
        _print_findings(out, got.findings)
    if got.errors:
        raise typer.Exit(1)


def ray_env_lines(url: str, token_path: Path) -> list[str]:
    """The environment Ray's own `ray job ...` needs to reach the tunnelled cluster: its
    address, and token authentication with the token given by path."""
    import shlex

    return [
        f"export RAY_ADDRESS={shlex.quote(url)}",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={shlex.quote(str(token_path.resolve()))}",
    ]


def tunnel_doc(
    dash: str,
    board: str,
    token_path: Path,
    exports: list[str],
    board_head_port: int = 0,
    served: Board | None = None,
) -> dict[str, object]:
    """What `tunnel --json` prints: the local URLs and ports (TensorBoard's port on the head
    too, and whether TensorBoard serves there), and the export lines."""
    from urllib.parse import urlsplit

    tensorboard: dict[str, object] = {
        "url": board,
        "port": urlsplit(board).port,
        "head_port": board_head_port,
    }
    if served is not None:
        tensorboard.update(
            serving=served.serving,
            state=served.state,
            logdir=served.logdir,
            error=served.error or None,
            fix=served.fix or None,
        )
    return {
        "dashboard": {"url": dash, "port": urlsplit(dash).port},
        "tensorboard": tensorboard,
        "token_path": str(token_path.resolve()),
        "exports": exports,
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def tunnel_cmd(
    inventory: InventoryOption,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", help="Local dashboard port (default: a free one).", min=1, max=65535
        ),
    ] = None,
    json_: JsonOption = False,
) -> None:
    """Forward the head's dashboard, and TensorBoard over the jobs' results (started on the
    head where Ray runs, on the port after the metrics export port in the cluster's ports:
    port_base+9 in a block, 8091 with Ray's default ports), here until Ctrl-C; TensorBoard
    stops with it. Nothing is forwarded to a dashboard port held by anything but this
    cluster's own Ray. With --json: one JSON document ({"dashboard", "tensorboard",
    "token_path", "exports"}) as soon as the tunnels are up; it keeps running until Ctrl-C."""
    from provisioner.cluster import board as board_mod
    from provisioner.cluster.tunnel import tensorboard_port, tunnel
    from provisioner.node import token

    out = output(json_)
    inv = load_cluster(inventory)
    # where Ray runs on the head; the pin is not needed here
    runtime = cluster_context(inv, with_pin=False).runtime
    # SIGTERM (a service manager, `kill`) and SIGHUP (its terminal closed) end the tunnel as
    # Ctrl-C does, through the stack below, so TensorBoard stops with it on the head
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    with Pool(inv) as pool, ExitStack() as stack:
        dash = stack.enter_context(tunnel(inv, runtime=runtime, local_port=port, pool=pool))
        board_port = tensorboard_port(inv.ports)
        head = pool.session(inv.head)
        with out.step("starting TensorBoard on the head"):
            served = board_mod.serve(head, runtime, board_port)
        stack.callback(board_mod.stop, head, runtime, served)
        board = stack.enter_context(tunnel(inv, remote_port=board_port, pool=pool))
        token_path = token.local_token_path(inv)
        exports = ray_env_lines(dash, token_path)
        if not served.serving:
            _warn(out, [f"no TensorBoard: {served.error} (fix: {served.fix})"])
        if json_:
            out.emit(tunnel_doc(dash, board, token_path, exports, board_port, served))
        else:
            what = (
                f"the jobs' results on the head ({served.logdir})"
                if served.serving
                else "not serving, see the warning"
            )
            out.say(
                f"dashboard:   {dash}\ntensorboard: {board} (the head's port {board_port}: "
                f"{what})\n(Ctrl-C to stop)"
            )
            out.say(f"the dashboard asks for the token: {token_path}")
            out.say("for Ray's own CLI (`ray job list`, `ray job logs -f JOB`), in another shell:")
            for line in exports:
                out.say(line)
        while True:
            time.sleep(3600)


def register(app: typer.Typer) -> None:
    app.command("render")(render)
    app.command("up")(up)
    app.command("status")(status)
    app.command("down")(down)
    app.command("logs")(logs)
    app.command("tunnel")(tunnel_cmd)
