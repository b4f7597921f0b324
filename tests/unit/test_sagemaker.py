"""SageMaker: the contract's files as the SDK itself writes them, the playbook's arguments as
hyperparameters and back, the choice of instance types, cost, the training image's tag and
the rendered job (the CreateTrainingJob request built by the SDK's ModelTrainer)."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.image.pin import Pin, Versions, write_pin
from provisioner.sagemaker import plan
from provisioner.sagemaker.container import contract, train
from provisioner.sagemaker.image import context_files, dockerfile, tag_for

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"
ARGS = ["--max-iterations", "5", "--obs-filter", "--lr=0.001", "--env-runners", "3"]


def _sdk_config_files(tmp_path: Path, hosts: int, host: str, hyper: dict[str, str]) -> Path:
    """hyperparameters.json and resourceconfig.json for `host`, written by the SDK's own
    local-mode container class (what `docker compose` then mounts at /opt/ml/input)."""
    from sagemaker.train.local.local_container import _LocalContainer

    c = _LocalContainer(
        training_job_name="unit",
        instance_type="local",
        instance_count=hosts,
        image="provisioner/ray-sagemaker:unit",
        container_root=str(tmp_path),
        input_data_config=[],
        environment={},
        hyper_parameters=hyper,
        container_entrypoint=None,
        container_arguments=None,
    )
    c._create_config_file_directories(host)
    c._write_config_files(host, [], hyper)
    return tmp_path / host / "input" / "config"


def _sdk_hyperparameters(hyper: dict[str, str]) -> dict[str, str]:
    """The hyperparameters as ModelTrainer puts them in its training request."""
    from sagemaker.core.training.configs import Compute
    from sagemaker.train import ModelTrainer
    from sagemaker.train.model_trainer import Mode

    trainer = ModelTrainer(
        training_image="provisioner/ray-sagemaker:unit",
        training_mode=Mode.LOCAL_CONTAINER,
        compute=Compute(instance_type="local", instance_count=1),
        hyperparameters=hyper,
    )
    return dict(trainer._create_training_job_args()["hyper_parameters"])


def test_the_sdks_files_give_every_host_its_place(tmp_path: Path) -> None:
    for host in ("algo-1", "algo-2", "algo-3"):
        config = _sdk_config_files(tmp_path, 3, host, {})
        res = contract.parse_resources((config / "resourceconfig.json").read_text(), {})
        assert res.hosts == ("algo-1", "algo-2", "algo-3")
        assert res.current_host == host and res.head == "algo-1"
        assert res.is_head == (host == "algo-1")
        assert res.instance_type == "local"


def test_the_playbooks_arguments_survive_the_sdks_round_trip(tmp_path: Path) -> None:
    hyper = contract.hyperparameters_of("ppo_cartpole.py", ARGS)
    sent = _sdk_hyperparameters(hyper)
    config = _sdk_config_files(tmp_path, 1, "algo-1", sent)
    read = contract.parse_hyperparameters((config / "hyperparameters.json").read_text(), {})
    job = contract.job_of(read)
    assert job.playbook == "ppo_cartpole.py"
    assert job.args == (
        "--max-iterations", "5", "--obs-filter", "--lr", "0.001", "--env-runners", "3",
    )  # fmt: skip
    # and the playbook's own parser reads them as it reads the originals
    sys.path.insert(0, str(PLAYBOOK.parent))
    try:
        import rlrun

        p = rlrun.parser("", target_return=1.0, max_env_steps=1)
        assert vars(p.parse_args(list(job.args))) == vars(p.parse_args(ARGS))
    finally:
        sys.path.remove(str(PLAYBOOK.parent))


def test_sm_variables_win_over_the_files() -> None:
    text = json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]})
    env = {"SM_HOSTS": '["h0", "h1"]', "SM_CURRENT_HOST": "h1"}
    res = contract.parse_resources(text, env)
    assert (res.hosts, res.current_host, res.is_head) == (("h0", "h1"), "h1", False)
    hps = contract.parse_hyperparameters('{"a": "1"}', {"SM_HPS": '{"a": 2, "b": "x"}'})
    assert hps == {"a": "2", "b": "x"}
    assert str(contract.channel_dir("code", {"SM_CHANNEL_CODE": "/x"})) == "/x"
    assert str(contract.channel_dir("code", {})) == "/opt/ml/input/data/code"
    assert str(contract.checkpoint_dir({})) == "/opt/ml/checkpoints"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"hosts": [], "current_host": "algo-1"}', "no `hosts`"),
        ('{"hosts": ["algo-1"], "current_host": "algo-9"}', "not one of"),
        ('{"hosts": ["algo-1", "algo-1"], "current_host": "algo-1"}', "twice"),
        ('{"hosts": ["a;rm -rf /"], "current_host": "a;rm -rf /"}', "not a host name"),
    ],
)
def test_bad_resource_configs_are_named(text: str, says: str) -> None:
    with pytest.raises(contract.ContractError, match=says):
        contract.parse_resources(text, {})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["positional"], "not an option"),
        (["--"], "not an option"),
        (["--a", "1", "--a", "2"], "twice"),
        (["--a="], "empty value"),
        (["--provisioner_playbook", "x.py"], "cannot be"),
        (["--bad key", "1"], "cannot be"),
    ],
)
def test_arguments_that_cannot_be_hyperparameters_are_refused(args: list[str], says: str) -> None:
    with pytest.raises(contract.ContractError, match=says):
        contract.hyperparameters_of("p.py", args)


def test_the_playbook_must_be_a_file_of_the_code_channel() -> None:
    for bad in ("", "../x.py", "a/b.py", "x.sh"):
        with pytest.raises(contract.ContractError):
            contract.job_of({contract.PLAYBOOK_KEY: bad})
    # the SDK's own keys (sagemaker_*) are not the playbook's options
    job = contract.job_of({contract.PLAYBOOK_KEY: "p.py", "sagemaker_program": "x", "n": "1"})
    assert job.args == ("--n", "1")


def test_a_failure_reason_keeps_its_end_within_1_kib() -> None:
    short = contract.failure_text("  boom \n")
    assert short == "boom"
    long = contract.failure_text("x" * 5000 + "ValueError: the last line")
    assert len(long.encode()) <= contract.FAILURE_BYTES and long.endswith("the last line")


def test_instance_types_run_local_and_render_real() -> None:
    plan.check_local("local", 2)
    plan.check_local("local_gpu", 1)
    plan.check_real("ml.c5.2xlarge", 4)
    with pytest.raises(InputError, match="not reachable from here") as e:
        plan.check_local("ml.c5.2xlarge", 4)
    assert e.value.exit_code == 2 and "sagemaker render" in (e.value.fix or "")
    for bad in ("c5.2xlarge", "local ", ""):
        with pytest.raises(InputError):
            plan.check_local(bad, 1)
    with pytest.raises(InputError):
        plan.check_real("local", 1)
    for count in (0, -1, 101):
        with pytest.raises(InputError, match="instance-count"):
            plan.check_local("local", count)


def test_cost_is_instance_hours_times_the_price() -> None:
    c = plan.cost("ml.c5.2xlarge", 4, 1800.0, 0.408)
    assert c["instance_hours"] == 2.0 and c["cost"] == pytest.approx(0.816)
    assert plan.cost("local", 2, 60.0, None)["cost"] is None


def test_a_sagemaker_runs_cost_has_the_shape_of_a_cluster_runs() -> None:
    """summary.json's `cost` compares field by field with a cluster job's (rlrun)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "playbooks"))
    import rlrun

    on_sagemaker = plan.comparable_cost(plan.cost("ml.c5.2xlarge", 4, 1800.0, 0.408))
    on_cluster = rlrun.cost_of("node-hour", 2.0, 0.3)
    assert on_sagemaker.keys() == on_cluster.keys()
    assert on_sagemaker["unit"] == "instance-hour" and on_sagemaker["hours"] == 2.0
    assert on_sagemaker["cost"] == pytest.approx(0.816) and on_cluster["cost"] == 0.6


def test_the_training_images_tag_follows_its_base_and_its_files() -> None:
    files = context_files("provisioner/ray:local", "sha256:" + "a" * 64)
    tag = tag_for("sha256:" + "a" * 64, files)
    assert tag.startswith("provisioner/ray-sagemaker:") and len(tag.split(":")[1]) == 12
    assert tag_for("sha256:" + "b" * 64, files) != tag
    changed = {**files, "smcontainer/train.py": files["smcontainer/train.py"] + b"\n"}
    assert tag_for("sha256:" + "a" * 64, changed) != tag
    text = dockerfile("provisioner/ray:local", "sha256:x")
    assert text.startswith("FROM provisioner/ray:local\n") and 'CMD ["train"]' in text
    assert {"smcontainer/contract.py", "smcontainer/train.py", "train"} <= set(files)


def test_the_entry_point_exports_the_final_checkpoint_and_metrics(tmp_path: Path) -> None:
    results, model = tmp_path / "ckpt", tmp_path / "model"
    (results / "checkpoints" / "iter-000003").mkdir(parents=True)
    (results / "checkpoints" / "iter-000003" / "state.pkl").write_bytes(b"w")
    (results / "checkpoints" / "iter-000002").mkdir()
    (results / "metrics.csv").write_text("iteration\n1\n2\n3\n")
    (results / "summary.json").write_text(json.dumps({"checkpoint": "checkpoints/iter-000003"}))
    train.export_model(results, model)
    assert (model / "checkpoints" / "iter-000003" / "state.pkl").read_bytes() == b"w"
    assert not (model / "checkpoints" / "iter-000002").exists()
    assert (model / "metrics.csv").read_text() == (results / "metrics.csv").read_text()
    assert train.latest_checkpoint(results) == results / "checkpoints" / "iter-000003"
    assert train.ray_start_args({"PROVISIONER_SM_NUM_CPUS": "4"}) == [
        "--disable-usage-stats",
        "--num-cpus=4",
    ]


def test_render_writes_the_sdks_request_for_four_c5_2xlarge(tmp_path: Path) -> None:
    from provisioner.sagemaker.render import RenderOptions, render

    pin_path = tmp_path / "image.lock.json"
    write_pin(
        Pin(
            image_id="sha256:" + "c" * 64,
            layers=("sha256:" + "d" * 64,),
            base_image="debian",
            base_image_id="sha256:" + "e" * 64,
            requirements_sha256="f" * 64,
            versions=Versions("3.11", "2.60.0", "2.13.0", "1.0"),
            size=1,
        ),
        pin_path,
    )
    out = tmp_path / "job"
    opened: list[str] = []

    def audit(event: str, args: tuple[object, ...]) -> None:
        if event == "socket.connect" and watching:
            opened.append(str(args[1]))

    watching = True
    sys.addaudithook(audit)  # stays for the process: it only records while `watching`
    with socket.socket(socket.AF_UNIX) as probe, contextlib.suppress(OSError):
        probe.connect(str(tmp_path / "no-such-socket"))
    assert opened == [str(tmp_path / "no-such-socket")]  # the positive control: it records
    opened.clear()
    done = render(
        RenderOptions(
            PLAYBOOK, tuple(ARGS), "ml.c5.2xlarge", 4, out, pin_path,
            account="123456789012", region="eu-west-1", bucket="s3://my-bucket/rl",
        )
    )  # fmt: skip
    watching = False
    assert opened == [], f"render reached out: {opened}"  # no AWS, no telemetry
    request = json.loads((out / "create-training-job.json").read_text())
    assert request["ResourceConfig"]["InstanceType"] == "ml.c5.2xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 4
    assert request["AlgorithmSpecification"]["TrainingImage"] == (
        f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/{done.image_tag}"
    )
    assert request["CheckpointConfig"] == {
        "S3Uri": "s3://my-bucket/rl/provisioner/provisioner-ppo-cartpole/checkpoints/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert request["HyperParameters"] == contract.hyperparameters_of("ppo_cartpole.py", ARGS)
    assert request["RoleArn"].startswith("arn:aws:iam::123456789012:role/")
    (code,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "code"]
    push = (out / "push.sh").read_text()
    assert code["DataSource"]["S3DataSource"]["S3Uri"] in push
    assert f"docker push 123456789012.dkr.ecr.eu-west-1.amazonaws.com/{done.image_tag}" in push
    assert (out / "code" / "ppo_cartpole.py").is_file() and (out / "code" / "rlrun.py").is_file()
    script = (out / "train_job.py").read_text()
    compile(script, "train_job.py", "exec")
    assert "instance_count=4" in script and done.image_uri in script
    # the job's Ray token: the `auth` channel, a file push.sh makes and pipes to S3
    (auth,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == contract.AUTH_CHANNEL]
    auth_s3 = auth["DataSource"]["S3DataSource"]["S3Uri"]
    assert "head -c 32 /dev/urandom" in push and f"- {auth_s3}token" in push
    assert repr(auth_s3) in script


def test_progress_shows_the_entry_points_and_the_loops_lines_only() -> None:
    from provisioner.sagemaker.local import shown

    assert shown("\x1b[36malgo-1_1  |\x1b[0m [train] algo-1 of ['algo-1']") == (
        "algo-1: [train] algo-1 of ['algo-1']"
    )
    assert shown("algo-2_1  | iter    3  steps  1200  return 20.1") == (
        "algo-2: iter    3  steps  1200  return 20.1"
    )
    assert shown("algo-1_1  | 2026-12-02 INFO scripts.py:1088 -- Next steps") is None
    assert shown("Creating sm-x_algo-1_1 ... done\r") is None
    assert shown("algo-1_1  | ValueError: bad") == "algo-1: ValueError: bad"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--instance-type", "ml.c5.2xlarge", "--instance-count", "2"], "sagemaker render"),
        (["--instance-count", "0"], "instance-count"),
        (["--", "positional"], "not an option"),
        (["--instance-type", "bogus"], "not an instance type"),
    ],
)
def test_bad_input_to_run_is_exit_2_with_one_clear_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from provisioner.cli import run

    code = run(["sagemaker", "run", str(PLAYBOOK), *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err, err


def test_a_cluster_jobs_results_seed_the_checkpoint_channel(tmp_path: Path) -> None:
    """`sagemaker run --resume JOB`: the cluster job's latest checkpoint and its metrics,
    from this machine's results folder, go into the new job's checkpoint channel
    (RESULTS/NEW) under the name the entry point continues from."""
    from provisioner.sagemaker.local import seed_resume

    results = tmp_path / "results"
    job = "ppo-cartpole-20260101-000000-abcdef012345"
    for n in (12, 14):
        ckpt = results / job / "checkpoints" / f"iter-{n:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "rllib_checkpoint.json").write_text(json.dumps({"iteration": n}))
    (results / job / "metrics.csv").write_text("iteration,env_steps\n1,1000\n")
    (results / job / "summary.json").write_text("{}")
    new = results / "new"
    new.mkdir()
    assert seed_resume(job, results, new) == job
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == ["iter-000014"]
    assert (new / "checkpoints" / "iter-000014" / "rllib_checkpoint.json").is_file()
    assert (new / "metrics.csv").read_text() == "iteration,env_steps\n1,1000\n"
    assert not (new / "summary.json").exists()  # the new run writes its own
    with pytest.raises(InputError, match="no checkpoint of job"):
        seed_resume("ppo-cartpole-not-home", results, tmp_path / "other")


def test_the_written_cost_is_the_written_hours_times_the_price() -> None:
    """A reader checks summary.json by hand: cost = hours x price with the hours as
    written (2 instances for 57.8 s at 0.5 once gave 0.01606 beside 0.03211 hours)."""
    from playbooks import rlrun

    for seconds in (57.8, 57.81, 1.0, 3599.99, 12345.678):
        c = plan.cost("local", 2, seconds, 0.5)
        assert c["cost"] == round(c["instance_hours"] * 0.5, 5), (seconds, c)
        mine = rlrun.cost_of("node-hour", 2 * seconds / 3600, 0.5)
        assert mine["cost"] == round(mine["hours"] * 0.5, 5), (seconds, mine)


def test_the_entry_point_gives_ray_the_jobs_token_by_path_or_refuses_to_start(
    tmp_path: Path,
) -> None:
    env = {f"SM_CHANNEL_{contract.AUTH_CHANNEL.upper()}": str(tmp_path)}
    with pytest.raises(contract.ContractError, match="no Ray token"):
        train.use_token(dict(env))
    (tmp_path / contract.TOKEN_FILE).write_text("f" * 64)
    train.use_token(env)
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / contract.TOKEN_FILE)
    assert "f" * 64 not in json.dumps(env)


def test_a_local_jobs_token_is_private_and_its_own(tmp_path: Path) -> None:
    from provisioner.sagemaker.local import make_token

    one, two = tmp_path / "a", tmp_path / "b"
    one.mkdir()
    two.mkdir()
    tokens = []
    for root in (one, two):
        auth = make_token(root)
        token = auth / contract.TOKEN_FILE
        assert (auth.stat().st_mode & 0o777, token.stat().st_mode & 0o777) == (0o700, 0o600)
        tokens.append(token.read_text())
    assert tokens[0] != tokens[1] and all(len(t) == 64 for t in tokens)


def _planted(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A staging folder as a hostile job leaves it: plain files beside links to this
    machine's files and folders, a FIFO, and a name a tar would refuse."""
    import os

    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text("SECRET")
    staging = tmp_path / "staging"
    (staging / "checkpoints" / "iter-000001").mkdir(parents=True)
    (staging / "metrics.csv").write_text("iteration\n1\n")
    (staging / "checkpoints" / "iter-000001" / "state.pkl").write_bytes(b"\0state")
    (staging / "failure").symlink_to(outside / "secret.txt")
    (staging / "model").symlink_to(outside / "dir")
    (staging / "stolen.txt").symlink_to(outside / "secret.txt")
    (staging / "stolen-dir").symlink_to(outside)
    os.mkfifo(staging / "pipe")
    (staging / ".tmp-metrics.csv").write_text("half")
    (staging / "bad\nname").write_text("x")
    return staging, tmp_path / "home", outside


def test_what_a_job_leaves_comes_home_as_plain_files_and_no_link_is_followed(
    tmp_path: Path,
) -> None:
    from provisioner.sagemaker import bring
    from provisioner.sagemaker.local import channel_skip

    staging, home, outside = _planted(tmp_path)
    sync = bring.Sync(staging, home, "a job's results", "the test", skip=channel_skip)
    assert sorted(sync.once()) == ["checkpoints/iter-000001/state.pkl", "metrics.csv"]
    found = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert found == ["checkpoints", "checkpoints/iter-000001",
                     "checkpoints/iter-000001/state.pkl", "metrics.csv"]  # fmt: skip
    assert (home / "checkpoints" / "iter-000001" / "state.pkl").read_bytes() == b"\0state"
    assert sync.skipped == {"stolen.txt", "stolen-dir", "pipe", "bad\nname"}
    assert sorted(p.name for p in outside.rglob("*")) == ["dir", "secret.txt"]
    assert (home / "metrics.csv").stat().st_mode & 0o777 == 0o600
    # again: only what changed comes (the metrics rewritten), and it replaces the old copy
    assert sync.once() == []
    (staging / "metrics.csv").write_text("iteration\n1\n2\n")
    assert sync.once() == ["metrics.csv"]
    assert (home / "metrics.csv").read_text() == "iteration\n1\n2\n"


def test_a_containers_failure_is_read_bounded_and_never_through_a_link(tmp_path: Path) -> None:
    import os

    from provisioner.sagemaker import bring

    (tmp_path / "secret").write_text("SECRET")
    (tmp_path / "failure").write_text("x" * 10_000)
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "pipe")
    assert bring.read_bounded(tmp_path / "failure", 100) == "x" * 100
    assert bring.read_bounded(tmp_path / "link", 100) is None
    assert bring.read_bounded(tmp_path / "pipe", 100) is None  # not opened to wait on
    assert bring.read_bounded(tmp_path / "absent", 100) is None


def test_the_sdks_compose_file_names_the_jobs_own_network_and_it_copies_nothing(
    tmp_path: Path,
) -> None:
    import yaml
    from sagemaker.train.local.local_container import _LocalContainer

    from provisioner.sagemaker.local import COMPOSE_FILE, network_name, sdk_patched

    c = _LocalContainer(
        training_job_name="unit",
        instance_type="local",
        instance_count=2,
        image="provisioner/ray-sagemaker:unit",
        container_root=str(tmp_path),
        input_data_config=[],
        environment={},
        hyper_parameters={},
        container_entrypoint=None,
        container_arguments=None,
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "stolen").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("SECRET")
    volumes = [f"{tmp_path / 'model'}:/opt/ml/model"]
    with sdk_patched(network_name("job-1")):
        content = c._generate_compose_file({}, volumes)
        c.retrieve_artifacts(content)
    written = yaml.safe_load((tmp_path / COMPOSE_FILE).read_text())
    assert written["networks"] == {"sagemaker-local": {"name": "sagemaker-local-job-1"}}
    assert written["services"]["algo-2"]["networks"] == {"sagemaker-local": {"aliases": ["algo-2"]}}
    assert not (tmp_path / "artifacts").exists()  # nothing copied (through the link or not)
    # afterwards the SDK is itself again (the positive control of both)
    c._generate_compose_file({}, volumes)
    assert yaml.safe_load((tmp_path / COMPOSE_FILE).read_text())["networks"] == {
        "sagemaker-local": {"name": "sagemaker-local"}
    }
    c.retrieve_artifacts(content)  # the SDK's own copy reads through the job's link
    assert (tmp_path / "artifacts" / "model" / "stolen").read_text() == "SECRET"
