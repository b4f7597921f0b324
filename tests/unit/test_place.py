"""The seam for where a job runs (`provisioner.jobs.place`): every place's outcome is a
`JobOutcome`, and what a job does after it ends (the plots, the summary with its cost) is
one function, `jobs.results.finish`, for a cluster job and a SageMaker job alike."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from provisioner.jobs.link import Target
from provisioner.jobs.place import Cluster, JobOutcome, Place
from provisioner.jobs.results import finish
from provisioner.jobs.spec import make_spec
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


def test_the_cluster_and_sagemaker_are_places(tmp_path: Path) -> None:
    from provisioner.sagemaker.place import RunOptions, SageMakerLocal

    playbook = tmp_path / "train.py"
    playbook.write_text("print('hi')\n")
    cluster = Cluster(
        Target(inventory=None, address="http://127.0.0.1:8265", token_path=None),
        make_spec(playbook, []),
        tmp_path / "results",
        Handlers(),
    )
    opts = RunOptions(playbook, (), "local", 1, tmp_path, tmp_path, tmp_path / "pin.json")
    sagemaker = SageMakerLocal(opts)

    assert isinstance(cluster, Place) and cluster.name == "cluster"
    assert isinstance(sagemaker, Place) and sagemaker.name == "sagemaker-local"
    assert not isinstance(object(), Place)  # the check can fail
