"""The seam for where a job runs (`provisioner.jobs.place`): the cluster, an sbatch script
and SageMaker are `Place`s (submit, follow, bring_home, resume, cost); every outcome is a
`JobOutcome`; what a job does after it ends (the plots, the summary) is one function,
`jobs.home.finish`, and its cost one method, `Place.cost`, for every place (that the CLI
reaches the places through the seam only is `test_layering`'s)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.inventory import Inventory, load_inventory
from provisioner.jobs.home import finish
from provisioner.jobs.link import Target
from provisioner.jobs.place import Cluster, Cost, JobOutcome, JobSpec, Place, Sbatch
from provisioner.jobs.stream import Handlers

METRICS = "iteration,env_steps,episode_return_mean\n1,1000,10.5\n2,2000,20.25\n"


def _home(root: Path, name: str) -> Path:
    home = root / name
    home.mkdir()
    (home / "metrics.csv").write_text(METRICS)
    summary = {"iterations": 2, "env_steps": 2000, "stopped_by": "budget"}
    (home / "summary.json").write_text(json.dumps(summary))
    return home


def _sagemaker_outcome(home: Path) -> JobOutcome:
    from provisioner.sagemaker.local import RunOptions, _finish

    opts = RunOptions(
        playbook=Path("train.py"),
        args=(),
        instance_type="local",
        instance_count=2,
        results_root=home.parent,
        state_dir=home.parent,
        pin_path=home.parent / "image.lock.json",
        price_per_hour=3.6,
    )
    return _finish(opts, home.name, home, "img:1", 1800.0, None, None)


def test_a_cluster_job_and_a_sagemaker_job_are_finished_by_the_same_function(
    tmp_path: Path,
) -> None:
    cluster_home = _home(tmp_path, "ppo-cluster")
    cluster = JobOutcome("ppo-cluster", "SUCCEEDED", finish(cluster_home, None))
    sagemaker = _sagemaker_outcome(_home(tmp_path, "ppo-sagemaker"))

    assert isinstance(sagemaker, JobOutcome) and sagemaker.ok and cluster.ok
    for outcome in (cluster, sagemaker):
        home = outcome.results.directory
        assert outcome.results.plots == [home / "training.png"]
        png = home / "training.png"
        assert png.read_bytes().startswith(b"\x89PNG")
        assert stat.S_IMODE(png.stat().st_mode) == 0o600
        assert outcome.results.summary is not None
        assert outcome.results.summary["env_steps"] == 2000
        assert outcome.results.unreadable == []
    # SageMaker's cost goes into summary.json, in the cluster's shape, before the
    # shared finish reads it back
    on_disk = json.loads((sagemaker.results.directory / "summary.json").read_text())
    assert sagemaker.results.summary == on_disk
    assert on_disk["cost"]["hours"] == 1.0 and on_disk["cost"]["cost"] == 3.6
    assert on_disk["sagemaker"]["instance_hours"] == 1.0
    assert sagemaker.to_json()["results"] == str(sagemaker.results.directory)
    assert sagemaker.to_json()["summary"] == on_disk


def test_a_plot_is_written_in_place_of_a_link_never_through_it(tmp_path: Path) -> None:
    home = _home(tmp_path, "ppo-1")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (home / "training.png").symlink_to(outside)

    found = finish(home, None)

    assert outside.read_text() == "keep me"
    assert not (home / "training.png").is_symlink()
    assert (home / "training.png").read_bytes().startswith(b"\x89PNG")
    assert found.plots == [home / "training.png"]


def _places(tmp_path: Path) -> list[Place]:
    from provisioner.sagemaker.place import SageMakerLocal

    target = Target(inventory=None, address="http://127.0.0.1:8265", token_path=None)
    cluster = Cluster(target, tmp_path / "results", Handlers())
    sagemaker = SageMakerLocal("local", 1, tmp_path / "results", tmp_path, tmp_path / "pin.json")
    return [cluster, Sbatch(_slurm_inventory(tmp_path)), sagemaker]


def _slurm_inventory(tmp_path: Path) -> Inventory:
    key = tmp_path / "id_ed25519"
    key.write_text("not read here\n")
    key.chmod(0o600)
    path = tmp_path / "inventory.yaml"
    path.write_text(
        "cluster: hpc\n"
        "ssh: {user: alice, key: id_ed25519}\n"
        "scheduler: {type: slurm, login: {name: login1, address: 10.1.0.5}, nodes: 2}\n"
        "runtime: host\n"
    )
    return load_inventory(path, openssh=False)


def test_the_cluster_sbatch_and_sagemaker_are_places(tmp_path: Path) -> None:
    places = _places(tmp_path)
    assert [p.name for p in places] == ["cluster", "sbatch", "sagemaker-local"]
    for place in places:
        assert isinstance(place, Place)
        for verb in ("submit", "follow", "bring_home", "resume", "cost", "run"):
            assert callable(getattr(place, verb))


def test_the_cost_is_read_once_for_every_place(tmp_path: Path) -> None:
    """A cluster job's node-hours and a SageMaker job's instance-hours, from summary.json,
    by the one `Place.cost`."""
    cluster_home = _home(tmp_path, "ppo-cluster")
    summary = json.loads((cluster_home / "summary.json").read_text())
    summary["cost"] = {"unit": "node-hour", "hours": 0.5, "price_per_hour": 2.0, "cost": 1.0}
    (cluster_home / "summary.json").write_text(json.dumps(summary))
    cluster_job = JobOutcome("ppo-cluster", "SUCCEEDED", finish(cluster_home, None))
    sagemaker_job = _sagemaker_outcome(_home(tmp_path, "ppo-sagemaker"))
    unpriced = JobOutcome("ppo-x", "SUCCEEDED", finish(_home(tmp_path, "ppo-x"), None))

    cluster, _, sagemaker = _places(tmp_path)
    assert cluster.cost(cluster_job) == Cost("node-hour", 0.5, 2.0, 1.0)
    assert cluster.cost(cluster_job).text() == "0.5 node-hours, cost 1.0"  # type: ignore[union-attr]
    seen = sagemaker.cost(sagemaker_job)
    assert seen is not None and seen.text() == "1.0 instance-hours, cost 3.6"
    assert cluster.cost(unpriced) is None
    assert Cost.of({"cost": {"unit": "node-hour", "hours": 0.25, "cost": None}}) == Cost(
        "node-hour", 0.25
    )
    assert Cost.of({"cost": {"hours": "many"}}) is None


def test_the_sbatch_place_writes_the_script_and_says_what_it_cannot_do(tmp_path: Path) -> None:
    playbook = tmp_path / "play" / "train.py"
    playbook.parent.mkdir()
    playbook.write_text("print('hi')\n")
    sbatch = Sbatch(_slurm_inventory(tmp_path))

    job = sbatch.submit(JobSpec(playbook=playbook, args=("--max-iterations", "3")))

    assert job.script is not None and job.script.startswith("#!")
    assert "#SBATCH --nodes=2" in job.script and "--max-iterations 3" in job.script
    for verb, call in (
        ("follow", lambda: sbatch.follow(job)),
        ("bring_home", lambda: sbatch.bring_home("17")),
        ("resume", lambda: sbatch.resume(JobSpec(playbook=playbook), "17")),
    ):
        with pytest.raises(InputError) as caught:
            call()
        assert caught.value.fix, verb
    with pytest.raises(InputError, match="no playbook at"):
        sbatch.submit(JobSpec(playbook=tmp_path / "absent.py"))


def test_sagemaker_local_resumes_through_its_run_options(tmp_path: Path) -> None:
    from provisioner.sagemaker.place import SageMakerLocal

    place = SageMakerLocal("local", 2, tmp_path / "results", tmp_path, tmp_path / "pin.json", 1.5)
    spec = place.resume(JobSpec(playbook=tmp_path / "train.py", args=("--x",)), "ppo-1")
    opts = place.options(spec)
    assert (opts.resume, opts.instance_count, opts.price_per_hour) == ("ppo-1", 2, 1.5)
    assert place.options(JobSpec(playbook=tmp_path / "train.py")).resume is None
    with pytest.raises(InputError):
        place.bring_home("nothing-here")
    (tmp_path / "results").mkdir()
    home = _home(tmp_path / "results", "j")
    assert place.bring_home("j").plots == [home / "training.png"]


def test_the_cli_renders_the_places_cost_line(tmp_path: Path) -> None:
    """`submit`'s and `sagemaker run`'s cost line is the place's `Cost`, rendered."""
    import io

    import typer

    from provisioner.cli.jobs import show_outcome
    from provisioner.console import Output

    home = _home(tmp_path, "ppo-cluster")
    summary = json.loads((home / "summary.json").read_text())
    summary["cost"] = {"unit": "node-hour", "hours": 0.25, "price_per_hour": 2.0, "cost": 0.5}
    (home / "summary.json").write_text(json.dumps(summary))
    cluster = _places(tmp_path)[0]
    shown = []
    for status in ("SUCCEEDED", "FAILED"):
        out = Output(stdout=io.StringIO(), stderr=io.StringIO())
        try:
            show_outcome(out, False, cluster, JobOutcome("ppo-cluster", status, finish(home, None)))
        except typer.Exit as exc:
            assert (status, exc.exit_code) == ("FAILED", 1)
        shown.append(out.stdout.getvalue())  # type: ignore[attr-defined]
    assert all("0.25 node-hours, cost 0.5\n" in text for text in shown), shown
    (home / "summary.json").write_text(json.dumps({"iterations": 2}))
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    show_outcome(out, False, cluster, JobOutcome("ppo-cluster", "SUCCEEDED", finish(home, None)))
    assert "node-hours" not in out.stdout.getvalue()  # type: ignore[attr-defined]
