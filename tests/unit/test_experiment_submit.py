"""`provisioner submit -i INV EXPERIMENT.yaml` (issue 45, item 1): the path from file to run.

The facts beside the pin (captured at `image build`), the job an experiment file is (its
runner, argv and entrypoint, by string), what results/JOB/ keeps (the file as written and
the resolved config), the runner's config against RLlib itself, and the real command on a
bad file: exit 2 naming its line before any connection. The run on a cluster is
tests/e2e/test_job_output.py's.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provisioner.cluster.headprobe import GcsNode
from provisioner.errors import InputError
from provisioner.experiment import ClusterCapacity, NodeCapacity, parse_experiment, resolved_config
from provisioner.experiment.facts import capture_source, runner_source
from provisioner.image.facts import (
    FACTS_KEY,
    checked_capture,
    facts_name,
    login_capture_command,
    pin_facts,
    write_facts,
)
from provisioner.image.pin import Pin, Versions, read_pin, write_pin
from provisioner.jobs import experiment as job_experiment
from provisioner.jobs.experiment import (
    CONFIG_FILE,
    EXPERIMENT_FILE,
    RUNNER_NAME,
    capacity_of,
    experiment_spec,
    kept_files,
    prepare_experiment,
    runner_args,
)
from provisioner.jobs.link import Target
from provisioner.jobs.spec import runner_command
from provisioner.jobs.submit import remember, retry_spec
from provisioner.jobs.watch import tune_resume_argv
from tests.unit.inventories import make_inventory
from tests.unit.test_experiment import CARTPOLE_PPO, FACTS, GOLDEN

PROVISIONER = Path(sys.executable).parent / "provisioner"

# The e2e file's shape: one seed, a short stop, two env runners.
SHORT = """\
# CartPole PPO, the tuned example's shape, stopped early
cartpole-ppo:
    env: CartPole-v1
    run: PPO
    stop: {training_iteration: 2}
    config:
        lr: 0.0003
        num_epochs: 6
        minibatch_size: 128
        train_batch_size_per_learner: 1000
    seeds: [7]
    checkpoint_frequency: 1
    resources: {env_runners: 2}
"""
# An old-stack key on line 8.
OLD_KEY = SHORT.replace("        num_epochs: 6\n", "        num_sgd_iter: 6\n")


def pin_with(tmp: Path, extra: dict[str, Any] | None = None) -> Path:
    path = tmp / "image.lock.json"
    write_pin(
        Pin(
            image_id="sha256:" + "a" * 64,
            layers=("sha256:" + "b" * 64,),
            base_image="debian",
            base_image_id="sha256:" + "c" * 64,
            requirements_sha256="d" * 64,
            versions=Versions("3.11.2", "2.60.0", "2.9.1", "1.2.2"),
            size=1,
            extra=extra or {},
        ),
        path,
    )
    return path


def pin_with_facts(tmp: Path) -> Path:
    entry = write_facts(checked_capture(GOLDEN.read_bytes(), "golden"), tmp / "image.lock.json")
    return pin_with(tmp, {FACTS_KEY: entry})


# --- the facts beside the pin ------------------------------------------------------------------


def test_the_facts_file_is_named_beside_the_pin() -> None:
    assert facts_name(Path("images/image.lock.json")) == "image.facts.json"
    assert facts_name(Path("images/image-cuda.lock.json")) == "image-cuda.facts.json"
    assert facts_name(Path("proj/pin.json")) == "pin.json.facts.json"


def test_the_pin_names_its_facts_by_sha256_and_stays_small(tmp_path: Path) -> None:
    pin_path = pin_with_facts(tmp_path)
    facts_file = tmp_path / "image.facts.json"
    pin = read_pin(pin_path)
    import hashlib

    assert pin.extra[FACTS_KEY] == {
        "file": "image.facts.json",
        "sha256": hashlib.sha256(facts_file.read_bytes()).hexdigest(),
    }
    found = pin_facts(pin, pin_path)
    assert found.facts is not None and found.missing == ""
    assert found.facts.algorithms["PPO"].defaults == FACTS.algorithms["PPO"].defaults
    assert found.facts.envs.keys() == FACTS.envs.keys()
    # why a file of their own: the pin a person reads stays small
    assert pin_path.stat().st_size < 2_000 < 100_000 < facts_file.stat().st_size


def test_facts_that_are_not_the_pins_are_not_taken(tmp_path: Path) -> None:
    pin_path = pin_with_facts(tmp_path)
    pin = read_pin(pin_path)
    facts_file = tmp_path / "image.facts.json"
    assert pin_facts(pin, pin_path).facts is not None  # the positive control
    facts_file.write_bytes(facts_file.read_bytes().replace(b'"PPO"', b'"PPX"', 1))
    changed = pin_facts(pin, pin_path)
    assert changed.facts is None and "sha256 differs" in changed.missing
    facts_file.unlink()
    gone = pin_facts(pin, pin_path)
    assert gone.facts is None and "cannot be read" in gone.missing
    (tmp_path / "old").mkdir()
    older = pin_facts(read_pin(pin_with(tmp_path / "old", None)), pin_path)
    assert older.facts is None and "names no experiment facts" in older.missing
    # an entry naming a path elsewhere is read beside the pin only
    elsewhere = replace(pin, extra={FACTS_KEY: {"file": "/etc/passwd", "sha256": "0"}})
    assert pin_facts(elsewhere, pin_path).path == tmp_path / "passwd"


def test_a_rebuild_of_the_same_image_keeps_its_facts_and_another_image_does_not(
    tmp_path: Path,
) -> None:
    from provisioner.image.build import kept_facts

    pin_path = pin_with_facts(tmp_path)
    entry = read_pin(pin_path).extra[FACTS_KEY]
    assert kept_facts("sha256:" + "a" * 64, pin_path) == entry  # the pin's own image
    assert kept_facts("sha256:" + "f" * 64, pin_path) is None  # another image: captured
    assert kept_facts("sha256:" + "a" * 64, tmp_path / "none.lock.json") is None  # no pin
    (tmp_path / "image.facts.json").write_text("{}")
    assert kept_facts("sha256:" + "a" * 64, pin_path) is None  # not the pin's facts


def test_a_project_pin_names_its_own_capture_never_its_bases(tmp_path: Path) -> None:
    from provisioner.image.facts import with_facts

    base = read_pin(pin_with_facts(tmp_path))
    inherited = replace(base, extra={**base.extra, "project": {"name": "gridcells"}})
    own = {"file": "image.facts.json", "sha256": "1" * 64}
    assert with_facts(inherited, own).extra == {"project": {"name": "gridcells"}, FACTS_KEY: own}
    assert with_facts(inherited, None).extra == {"project": {"name": "gridcells"}}
    assert inherited.extra[FACTS_KEY] != own  # the base's: what is replaced


def test_a_capture_that_is_no_facts_document_is_refused() -> None:
    from provisioner.errors import OperationError

    assert json.loads(checked_capture(GOLDEN.read_bytes(), "x"))["schema"] == 1
    with pytest.raises(OperationError, match="printed no JSON document"):
        checked_capture(b"Traceback (most recent call last):\n ImportError: ray\n", "img")
    with pytest.raises(InputError, match="schema 2"):
        checked_capture(b'{"schema": 2}', "img")


def test_the_capture_runs_through_a_login_shell_with_the_source_as_one_argument() -> None:
    argv = login_capture_command()
    assert argv[:5] == ["bash", "--login", "-c", 'exec python -c "$1"', "capture"]
    assert argv[5] == capture_source().decode() and len(argv) == 6
    # the shell hands the source over unchanged (quotes, $, backslashes and all)
    source = "import sys; print('it\\'s $HOME \"q\" \\\\')"
    done = subprocess.run(
        ["bash", "-c", f'exec {sys.executable} -c "$1"', "capture", source],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == 'it\'s $HOME "q" \\\n'


# --- the job an experiment file is ------------------------------------------------------------


def short(tmp: Path, text: str = SHORT, name: str = "cartpole.yaml") -> Path:
    book = tmp / "book"
    book.mkdir(exist_ok=True)
    path = book / name
    path.write_text(text)
    return path


def test_the_runners_arguments_are_the_files_keys(tmp_path: Path) -> None:
    exp = parse_experiment(short(tmp_path), SHORT)
    name, body = runner_args(exp)
    assert name == "cartpole.yaml"
    assert body == (
        '{"checkpoint_frequency":1,"config":{"env":"CartPole-v1","lr":0.0003,'
        '"minibatch_size":128,"num_env_runners":2,"num_epochs":6,'
        '"train_batch_size_per_learner":1000},"name":"cartpole-ppo","run":"PPO",'
        '"seeds":[7],"stop":{"training_iteration":2}}'
    )


def test_the_job_runs_the_runner_in_the_files_folder(tmp_path: Path) -> None:
    path = short(tmp_path)
    spec = experiment_spec(parse_experiment(path, SHORT), job_id="cartpole-1")
    assert spec.playbook == path.resolve() and spec.runner == RUNNER_NAME
    assert spec.runtime_env()["working_dir"] == str(path.parent.resolve())
    entry = spec.entrypoint()
    placed = runner_command("python3", RUNNER_NAME)
    run = shlex.join(["python3", "-u", RUNNER_NAME, *runner_args(spec_exp(path))])
    assert f"&& {placed} && {{ " in entry and entry.endswith(f"&& exec {run}")
    assert entry.index(placed) < entry.index("exec ")
    # resumed (`--resume JOB`, a retry): the runner through tune_resume, as a Tune script
    resumed = replace(spec, tune_experiment="cartpole-ppo").entrypoint()
    argv = tune_resume_argv("python3", RUNNER_NAME, spec.args)
    assert resumed.endswith(f"&& exec {shlex.join(argv)}") and placed in resumed
    # a playbook's entrypoint has no runner (the positive control of the first assert)
    from provisioner.jobs.spec import make_spec

    book = path.parent / "train.py"
    book.write_text("print(1)\n")
    assert "base64.b64decode(sys.argv[2])" not in make_spec(book).entrypoint()
    assert "base64.b64decode(sys.argv[2])" in entry
    # the job id is the experiment's name (the file's is `cartpole.yaml`)
    assert experiment_spec(spec_exp(path)).job_id.startswith("cartpole-ppo-")
    assert spec.excludes == ()  # the file's folder travels (as a script's does)


def test_a_file_run_again_from_its_results_travels_alone(tmp_path: Path) -> None:
    """results/JOB/experiment.yaml, submitted again: only the file is sent, not the earlier
    run's Tune folder, checkpoints and logs beside it (Ray's own walk says what goes)."""
    from provisioner.jobs.submit import upload_for

    home = tmp_path / "results" / "cartpole-ppo-1"
    (home / "ray_results" / "cartpole-ppo" / "trial").mkdir(parents=True)
    (home / "ray_results" / "cartpole-ppo" / "trial" / "result.json").write_text("{}\n")
    for name in ("experiment.yaml", "config.json", "submitted.json", "job.log", "odd[1]*.txt"):
        (home / name).write_text(SHORT if name == "experiment.yaml" else "x\n")
    again = experiment_spec(spec_exp(home / "experiment.yaml"))
    assert again.job_id.startswith("cartpole-ppo-") and again.runner == RUNNER_NAME
    assert upload_for(again).files == ["experiment.yaml"]
    assert len(upload_for(replace(again, excludes=())).files) == 6  # the positive control


def spec_exp(path: Path) -> Any:
    return parse_experiment(path, path.read_text())


def test_the_entrypoint_writes_the_runner_as_it_ships(tmp_path: Path) -> None:
    command = runner_command(sys.executable, RUNNER_NAME)
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert (tmp_path / RUNNER_NAME).read_bytes() == runner_source()
    assert runner_source().startswith(b'"""Runs with the CLUSTER')


def test_results_keep_the_file_as_written_and_its_resolved_config(tmp_path: Path) -> None:
    path = short(tmp_path)
    exp = spec_exp(path)
    files = kept_files(exp, path.read_bytes(), FACTS)
    assert files[EXPERIMENT_FILE] == SHORT.encode()  # its comment kept
    config = json.loads(files[CONFIG_FILE])
    assert config == resolved_config(exp, FACTS)
    assert config["seed"] == 7 and config["num_env_runners"] == 2
    assert config["_train_batch_size_per_learner"] == 1000 and config["lr"] == 0.0003


def test_the_retry_record_of_an_experiment_gives_back_its_runner(tmp_path: Path) -> None:
    path = short(tmp_path)
    spec = experiment_spec(spec_exp(path), job_id="cartpole-1")
    remember(tmp_path / "results", spec, 2, [])
    again, retries = retry_spec(tmp_path / "results", "cartpole-1")
    assert retries == 2 and again.runner == RUNNER_NAME and again.args == spec.args
    assert again.entrypoint() == spec.entrypoint()


def test_the_clusters_capacity_is_the_gcss_alive_nodes() -> None:
    nodes = [
        GcsNode("a", "10.250.0.1", True, {"CPU": 4.0, "GPU": 1.0, "memory": 1e9}),
        GcsNode("b", "10.250.0.2", True, {"CPU": 2.0}),
        GcsNode("c", "10.250.0.3", False, {"CPU": 64.0}),
    ]
    capacity = capacity_of(nodes)
    assert capacity == ClusterCapacity((NodeCapacity(4.0, 1.0), NodeCapacity(2.0, 0.0)))
    assert capacity.cpus == 6.0 and capacity.gpus == 1.0


# --- the verb: validated before anything is sent ------------------------------------------------


@pytest.fixture
def target(tmp_path: Path) -> Target:
    inventory = make_inventory(tmp_path, image_lock=pin_with_facts(tmp_path))
    return Target(inventory=inventory)


def test_a_bad_file_is_refused_with_its_line_before_any_connection(
    tmp_path: Path, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(job_experiment, "cluster_capacity", lambda t: asked.append("gcs"))
    path = short(tmp_path, OLD_KEY)
    with pytest.raises(InputError) as raised:
        prepare_experiment(target, path, tmp_path / "results")
    assert raised.value.where == f"{path}:8"
    assert "num_sgd_iter is a key of RLlib's old API stack" in raised.value.message
    assert "`num_epochs`" in (raised.value.fix or "")
    assert asked == [] and not (tmp_path / "results").exists()


def test_a_good_file_is_judged_on_the_clusters_capacity_and_kept(
    tmp_path: Path, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capacity's round trip is the e2e test's; here its answer is given."""
    capacity = ClusterCapacity((NodeCapacity(3.0),))
    monkeypatch.setattr(job_experiment, "cluster_capacity", lambda t: capacity)
    path = short(tmp_path)
    lines: list[str] = []
    spec = prepare_experiment(target, path, tmp_path / "results", lines.append)
    home = tmp_path / "results" / spec.job_id
    assert (home / EXPERIMENT_FILE).read_bytes() == path.read_bytes()
    assert json.loads((home / CONFIG_FILE).read_text()) == resolved_config(spec_exp(path), FACTS)
    assert spec.runner == RUNNER_NAME and any("3 CPUs" in line for line in lines), lines
    # 4 env runners of 1 CPU and the main process's 1 do not fit on 3 CPUs
    more = short(tmp_path, SHORT.replace("env_runners: 2", "env_runners: 4"), "more.yaml")
    with pytest.raises(InputError) as raised:
        prepare_experiment(target, more, tmp_path / "results")
    assert raised.value.where == f"{more}:13" and "needs 5 CPUs" in raised.value.message
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [spec.job_id]


# --- the runner builds the config that config.json keeps --------------------------------------


@pytest.mark.parametrize("text", [SHORT, CARTPOLE_PPO])
def test_the_runners_config_is_the_resolved_config(tmp_path: Path, text: str) -> None:
    """What the runner hands Tune (RLlib's default config, `update_from_dict` of the
    file's keys, the seeds as Tune's grid) is config.json, key for key."""
    from ray._common.deprecation import DEPRECATED_VALUE

    from provisioner.experiment import runner
    from provisioner.experiment.capture_facts import plain

    exp = parse_experiment(short(tmp_path, textwrap.dedent(text)), textwrap.dedent(text))
    run, config, run_args = runner.build(json.loads(runner_args(exp)[1]))
    assert run == exp.run and run_args == {"name": exp.name, "stop": exp.stop}
    real = {k: plain(v) for k, v in config.to_dict().items() if v is not DEPRECATED_VALUE}
    seeds = real.pop("seed")
    expected = resolved_config(exp, FACTS)
    assert seeds == (exp.seeds[0] if len(exp.seeds) == 1 else {"grid_search": exp.seeds})
    expected.pop("seed")
    assert real == expected


# --- the real command ---------------------------------------------------------------------------


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound and never listened on: every connection to it is refused."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        yield held.getsockname()[1]


def test_the_command_refuses_a_bad_file_with_exit_2_and_sends_nothing(
    tmp_path: Path, refusing_port: int
) -> None:
    """On an inventory whose head refuses every connection: a bad file exits 2 naming its
    line (nothing was reached for); the good file gets past validation to the head (the
    positive control: it fails on the connection, not on the file)."""
    pin = pin_with_facts(tmp_path)
    (tmp_path / "id_ed25519").write_text("not a real key\n")
    (tmp_path / "id_ed25519").chmod(0o600)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "cluster: expsubmit\nruntime: host\nhead: {name: h1, address: 127.0.0.1}\n"
        f"ssh: {{user: lab, port: {refusing_port}, key: id_ed25519}}\n"
        f"image: {{lock: {pin}}}\n"
    )
    env = {**os.environ, "PROVISIONER_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}

    def submit(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [str(PROVISIONER), "submit", "-i", str(inventory), "--results"]
        argv += [str(tmp_path / "results"), str(path), *extra]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    bad = submit(short(tmp_path, OLD_KEY))
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert f"{tmp_path}/book/cartpole.yaml:8" in bad.stderr and "num_epochs" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "results").exists()
    args = submit(short(tmp_path), "--", "--lr", "1")
    assert args.returncode == 2 and "takes no arguments" in args.stderr, args.stderr[-2000:]
    good = submit(short(tmp_path))
    assert good.returncode not in (0, 2), good.stderr[-2000:]
    assert "refused" in good.stderr.lower() and "cartpole.yaml:" not in good.stderr
    assert not (tmp_path / "results").exists()  # kept only once the cluster judged it


# --- a playbook's run keeps its arguments, and rlrun its whole config -----------------------------


def test_a_playbook_runs_arguments_are_kept_with_its_results(tmp_path: Path) -> None:
    from provisioner.jobs.spec import make_spec
    from provisioner.jobs.submit import SUBMITTED_FILE, keep_submitted

    book = tmp_path / "ppo_cartpole.py"
    book.write_text("print(1)\n")
    spec = make_spec(book, ["--lr", "0.001", "--max-iterations", "3"], job_id="ppo-1")
    keep_submitted(tmp_path / "results", replace(spec, resumed_from="ppo-0"), nodes=3)
    kept = json.loads((tmp_path / "results" / "ppo-1" / SUBMITTED_FILE).read_text())
    assert {k: v for k, v in kept.items() if k != "submitted_at"} == {
        "job_id": "ppo-1",
        "playbook": "ppo_cartpole.py",
        "args": ["--lr", "0.001", "--max-iterations", "3"],
        "runner": None,
        "attempt": 1,
        "resumed_from": "ppo-0",
        "nodes": 3,  # the cluster's (the inventory's): compare's node-hours
    }


def test_rlruns_config_json_is_the_algorithm_config_as_the_facts_write_it() -> None:
    """rlrun (the cluster's side: no provisioner there) writes config.json as the
    experiment facts' capture writes a config: the same JSON for the same config."""
    from ray._common.deprecation import DEPRECATED_VALUE
    from ray.rllib.algorithms.ppo import PPOConfig

    from provisioner.experiment.capture_facts import plain

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "playbooks"))
    import rlrun  # type: ignore[import-not-found]

    config = PPOConfig().environment("CartPole-v1")  # type: ignore[no-untyped-call]
    config = config.training(lr=0.001, num_epochs=3)
    kept = json.loads(json.dumps(rlrun.resolved_config(config)))
    real = config.to_dict()
    assert kept == {k: plain(v) for k, v in real.items() if v is not DEPRECATED_VALUE}
    assert kept["lr"] == 0.001 and kept["num_epochs"] == 3 and kept["env"] == "CartPole-v1"
    assert kept["callbacks"] == "ray.rllib.callbacks.callbacks.RLlibCallback"  # by its name


def test_the_readmes_example_file_passes() -> None:
    from provisioner.experiment import load_experiment, validate

    example = Path(__file__).resolve().parents[2] / "examples/experiments/cartpole-ppo.yaml"
    exp = load_experiment(example)
    assert exp.run == "PPO" and exp.env == "CartPole-v1"
    assert validate(exp, FACTS, ClusterCapacity((NodeCapacity(2.0), NodeCapacity(2.0)))) == []


def test_an_experiment_file_has_no_sbatch_script(tmp_path: Path) -> None:
    """SLURM runs a script without a cluster to validate against: refused, with the way
    that works (up on the allocation, then submit); a playbook gets past this check."""
    from provisioner.jobs.place import Sbatch
    from provisioner.jobs.spec import make_spec

    inventory = make_inventory(tmp_path)
    spec = experiment_spec(spec_exp(short(tmp_path)))
    with pytest.raises(InputError, match="has no sbatch script") as raised:
        Sbatch(inventory).submit(spec)
    assert "provisioner submit -i INVENTORY cartpole.yaml" in (raised.value.fix or "")
    book = tmp_path / "train.py"
    book.write_text("print(1)\n")
    with pytest.raises(InputError, match="no scheduler section"):  # the next check's
        Sbatch(inventory).submit(make_spec(book))
