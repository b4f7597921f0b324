"""`up` works on one context, in steps: which nodes (re)start (`start_needed`), the steps'
order and what flows between them, and the options the CLI's flags become."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.cluster import status, up
from provisioner.cluster.headprobe import GcsNode, Joined
from provisioner.errors import InputError
from provisioner.gpu.assignment import GpuPlan, signature
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.protocol import RayState
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin

PIN = "sha256:x"


def status_of(tmp_path: Path, states: dict[str, RayState], gcs_error: str | None = None) -> Any:
    inv = make_inventory(tmp_path)
    runtime = docker.DockerRuntime(inv, make_pin(image_id=PIN))
    alive = [GcsNode(n.name, n.address, True) for n in inv.nodes]
    before = status.assemble(inv, runtime, states, {}, alive)
    before.gcs_error = gcs_error
    ctx = up.UpContext(inv, None, runtime, runtime.pin, lambda _: None)  # type: ignore[arg-type]
    return ctx, before


def test_a_node_running_the_pin_with_its_gpus_is_left_alone(tmp_path: Path) -> None:
    plan = GpuPlan("gpus", ("GPU-1",), (0,))
    ok = RayState(status="running", runs=PIN, gpus=signature(plan))
    inv = make_inventory(tmp_path)
    ctx, before = status_of(tmp_path, {n.name: ok for n in inv.nodes})
    worker = ctx.inventory.workers[0]
    gpus = {worker.name: plan}
    assert not up.start_needed(ctx, gpus, before, worker, head_restarted=False)
    assert up.start_needed(ctx, gpus, before, worker, head_restarted=True)  # the head restarts
    other = {worker.name: GpuPlan("gpus", ("GPU-2",), (1,))}  # another GPU since
    assert up.start_needed(ctx, other, before, worker, head_restarted=False)
    assert up.start_needed(ctx, {}, before, worker, head_restarted=False)  # GPUs gone


def test_a_node_whose_shared_folder_is_not_the_inventorys_restarts(tmp_path: Path) -> None:
    """`storage: {path: DIR}` is a bind mount made at the container's start: a Ray started
    without it (or with another folder) restarts; one with it is left alone."""
    inv = make_inventory(tmp_path, storage="path", storage_path="/srv/shared")
    runtime = docker.DockerRuntime(inv, make_pin(image_id=PIN))
    alive = [GcsNode(n.name, n.address, True) for n in inv.nodes]
    ctx = up.UpContext(inv, None, runtime, runtime.pin, lambda _: None)  # type: ignore[arg-type]
    worker = inv.workers[0]
    for label, restarts in (("/srv/shared", False), ("", True), ("/mnt/other", True)):
        states = {n.name: RayState(status="running", runs=PIN, storage=label) for n in inv.nodes}
        before = status.assemble(inv, runtime, states, {}, alive)
        assert up.start_needed(ctx, {}, before, worker, head_restarted=False) is restarts, label
    # the head's store (no folder mounted): a Ray without the label is left alone
    ctx, before = status_of(
        tmp_path, {n.name: RayState(status="running", runs=PIN, storage="") for n in inv.nodes}
    )
    assert not up.start_needed(ctx, {}, before, ctx.inventory.workers[0], head_restarted=False)


def test_a_head_whose_gcs_does_not_answer_restarts(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    running = {n.name: RayState(status="running", runs=PIN) for n in inv.nodes}
    ctx, healthy = status_of(tmp_path, running)
    assert not up.start_needed(ctx, {}, healthy, ctx.inventory.head, head_restarted=False)
    ctx, broken = status_of(tmp_path, running, gcs_error="connection refused")
    assert up.start_needed(ctx, {}, broken, ctx.inventory.head, head_restarted=False)
    worker = ctx.inventory.workers[0]  # a worker does not care about the GCS's answer
    assert not up.start_needed(ctx, {}, broken, worker, head_restarted=False)
    stale = {**running, worker.name: RayState(status="running", runs="sha256:old")}
    ctx, old = status_of(tmp_path, stale)
    assert up.start_needed(ctx, {}, old, worker, head_restarted=False)  # another image


def test_bring_up_runs_its_steps_in_order_passing_what_each_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    decided, stopped = object(), object()
    joined = Joined(nodes=[], placement=[], timings={})

    def step(name: str, returns: Any = None, expects: tuple[Any, ...] = ()) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            assert all(any(a is e for a in args) for e in expects), (name, args)
            return returns

        return run

    monkeypatch.setattr(up, "plan", step("plan", decided))
    monkeypatch.setattr(up, "stop", step("stop", stopped, (decided,)))
    monkeypatch.setattr(up, "start", step("start", None, (decided, stopped)))
    monkeypatch.setattr(up, "wait", step("wait", joined, (decided,)))
    monkeypatch.setattr(up, "probe", step("probe", None, (decided, joined)))
    monkeypatch.setattr(up, "record", step("record", None, (decided, joined)))
    ctx, _ = status_of(tmp_path, {})
    result = up.bring_up(ctx)
    assert calls == ["plan", "stop", "start", "wait", "probe", "record"]
    assert result.runtime == "docker"


def test_the_clis_flags_become_the_options_with_the_same_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`provisioner up` with no flag passes one UpOptions equal to UpOptions()'s defaults,
    and each flag lands in its field."""
    import typer

    from provisioner.cli import cluster as cli_cluster
    from provisioner.cli import run

    seen: list[up.UpOptions] = []

    def fake_up_cluster(*args: Any, options: up.UpOptions, **kwargs: Any) -> Any:
        seen.append(options)
        raise typer.Exit(0)

    monkeypatch.setattr(up, "up_cluster", fake_up_cluster)
    monkeypatch.setattr(cli_cluster, "load_inventory", lambda path: _FakeInventory())
    assert run(["up", "-i", "x.yml"]) == 0
    flags = [
        "--force",
        "--no-doctor",
        "--timeout",
        "7",
        "--push",
        "relay",
        "--rotate-token",
    ]  # relay: a deprecated alias of chain, which says so
    capsys.readouterr()
    assert run(["up", "-i", "x.yml", *flags, "--queue-timeout", "9"]) == 0
    assert "--push relay is a deprecated alias of --push chain" in capsys.readouterr().err
    assert seen[0] == up.UpOptions()
    assert seen[1] == up.UpOptions(
        force=True, doctor=False, join_timeout=7, push="chain", rotate_token=True, queue_timeout=9
    )
    assert up.UpOptions().probe is True


class _FakeInventory:
    slurm = None
    image_lock = None
    runtime = "docker"
    nodes = ()  # the CLI's pool warms to none


def test_the_context_refuses_an_unknown_runtime_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))  # the cluster id
    inv = make_inventory(tmp_path, runtime="nosuch")
    with pytest.raises(InputError, match="nosuch"):
        up.context(inv, None, pin=None)  # type: ignore[arg-type]


def test_one_up_reads_the_pin_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`provisioner up` reads the pin file once and hands it down: the doctor (through to
    its verdict, which stops this `up`: no node answers) is given it and reads none."""
    from contextlib import contextmanager

    from provisioner.cli import cluster as cli_cluster
    from provisioner.cli import run
    from provisioner.cluster import subnet
    from provisioner.doctor import run as doctor_run
    from provisioner.errors import RemoteError
    from provisioner.image import pin as pin_mod
    from provisioner.image.pin import write_pin
    from provisioner.remote.results import GroupResult

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    lock = tmp_path / "image.lock.json"
    write_pin(make_pin(), lock)
    inv = make_inventory(tmp_path, image_lock=lock)
    reads: list[Path] = []
    real = pin_mod.read_pin

    def counted(path: Path) -> Any:
        reads.append(path)
        return real(path)

    class _Pool:
        @contextmanager
        def warm(self) -> Any:
            yield self

    def unreached(pool: Any, inventory: Any, *args: Any, **kwargs: Any) -> Any:
        return GroupResult(errors={n.name: RemoteError(n.name, "unreached", "") for n in inv.nodes})

    monkeypatch.setattr(pin_mod, "read_pin", counted)
    monkeypatch.setattr(cli_cluster, "read_pin", counted, raising=False)  # where it was bound
    monkeypatch.setattr(cli_cluster, "load_inventory", lambda path: inv)
    monkeypatch.setattr(cli_cluster, "Pool", lambda inventory: _Pool())
    monkeypatch.setattr(subnet, "resolve_ray_subnet", lambda held, pool, report: held)
    monkeypatch.setattr(up, "install_token_and_tls", lambda inventory, pool: None)
    monkeypatch.setattr(doctor_run, "gather_facts", unreached)
    monkeypatch.setattr(doctor_run, "run_probes", lambda *a, **k: ({}, GroupResult()))
    assert run(["up", "-i", str(inv.path), "--json"]) == 1
    assert '"stopped_by": "doctor"' in capsys.readouterr().out  # the doctor ran, and judged
    assert reads == [lock]
