"""Experiment files (issue 45, item 1): read with their lines, validated against the image's
facts, resolved to the algorithm config that will run.

The facts are the golden capture (tests/unit/golden/experiment/facts.json: RLlib 2.60 and
gymnasium 1.2.2, as in the image's lock), never a hand-made stand-in; where RLlib itself can
answer (is a key real, what does the config resolve to, what does it ask of the cluster),
the test asks the RLlib installed beside these tests.

The table of bad files and their messages: `python -m tests.unit.test_experiment` prints it.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import InputError
from provisioner.experiment import (
    ClusterCapacity,
    Experiment,
    NodeCapacity,
    bundles,
    check,
    load_experiment,
    load_facts,
    parse_experiment,
    resolved_config,
    validate,
)
from provisioner.experiment.facts import Facts, capture_source
from provisioner.experiment.resolve import overrides
from provisioner.experiment.runner import with_keys

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "golden" / "experiment" / "facts.json"
FACTS = load_facts(GOLDEN)
FILE = Path("exp.yaml")  # the path the table's files are named by

# A tuned example's shape (RLlib's rllib/tuned_examples/ppo/cartpole-ppo.yaml), on the new
# stack's keys, plus the cluster's extras.
CARTPOLE_PPO = """\
cartpole-ppo:
    env: CartPole-v1
    run: PPO
    stop:
        env_runners/episode_return_mean: 450
        num_env_steps_sampled_lifetime: 200000
    config:
        framework: torch
        gamma: 0.99
        lr: 3e-4
        lambda: 0.95
        num_epochs: 6
        minibatch_size: 128
        train_batch_size_per_learner: 4000
        vf_loss_coeff: 0.01
        entropy_coeff: 0.0
        _model_config:
            fcnet_hiddens: [64, 64]
    seeds: [0, 1, 2]
    checkpoint_frequency: 10
    evaluation:
        episodes: 20
        video: 2
    resources:
        env_runners: 2
        cpus_per_env_runner: 1
        learners: 0
        gpus_per_learner: 0
"""

PENDULUM_SAC = """\
pendulum-sac:
    env: Pendulum-v1
    run: SAC
    stop:
        env_runners/episode_return_mean: -400
        num_env_steps_sampled_lifetime: 20000
    config:
        actor_lr: 2e-4
        critic_lr: 8e-4
        alpha_lr: 9e-4
        tau: 0.005
        gamma: 0.99
        train_batch_size_per_learner: 256
        replay_buffer_config:
            type: PrioritizedEpisodeReplayBuffer
            capacity: 100000
            alpha: 1.0
            beta: 0.0
        num_steps_sampled_before_learning_starts: 256
        model_config:
            fcnet_hiddens: [256, 256]
            fcnet_activation: relu
    resources:
        env_runners: 1
"""


def parse(text: str) -> Experiment:
    return parse_experiment(FILE, textwrap.dedent(text))


def problems(text: str, cluster: ClusterCapacity | None = None) -> list[tuple[int, str, str]]:
    return [(p.line, p.message, p.fix) for p in validate(parse(text), FACTS, cluster)]


def cartpole(**replace: str) -> str:
    """The good CartPole file with some of its lines replaced (`old line` -> `new line`)."""
    text = CARTPOLE_PPO
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


# --- the good files -------------------------------------------------------------------------


def test_a_tuned_example_cartpole_ppo_passes_and_is_read_with_its_lines() -> None:
    exp = parse(CARTPOLE_PPO)
    assert validate(exp, FACTS) == []
    assert (exp.name, exp.env, exp.run) == ("cartpole-ppo", "CartPole-v1", "PPO")
    assert exp.stop == {
        "env_runners/episode_return_mean": 450,
        "num_env_steps_sampled_lifetime": 200000,
    }
    assert exp.config["lr"] == 0.0003  # YAML 1.2's number, not PyYAML 1.1's text "3e-4"
    assert exp.seeds == [0, 1, 2] and exp.checkpoint_frequency == 10
    assert exp.evaluation == {"episodes": 20, "video": 2}
    assert exp.line() == 1
    assert exp.line("run") == 3
    assert exp.line("config", "lr") == 10
    assert exp.line("config", "_model_config", "fcnet_hiddens") == 18
    assert exp.line("seeds", "2") == 19
    assert exp.line("resources", "gpus_per_learner") == 28
    assert exp.where("evaluation", "video") == "exp.yaml:23"
    # a key the file lacks: the line of the deepest one it has
    assert exp.line("config", "gamma", "nothing") == 9


def test_sac_on_pendulum_continuous_actions_passes() -> None:
    exp = parse(PENDULUM_SAC)
    assert validate(exp, FACTS) == []
    assert exp.seeds == [0]  # the default
    config = resolved_config(exp, FACTS)
    assert config["actor_lr"] == 0.0002 and config["env"] == "Pendulum-v1"
    assert config["num_env_runners"] == 1  # from resources
    assert config["seed"] == 0
    assert "clip_param" not in config  # SAC's keys, not PPO's


def test_an_env_by_class_path_or_module_id_is_left_to_the_image() -> None:
    """RLlib takes a class path (`cell_network.CellNetwork`, this project's own env) and
    gymnasium `module:Id`; the registry's facts cannot judge them (the image resolves them)."""
    for env in ("cell_network.CellNetwork", "my_envs:Grid-v0"):
        assert problems(cartpole(**{"env: CartPole-v1": f"env: {env}"})) == []
    # positive control: a plain id is judged
    assert problems(cartpole(**{"env: CartPole-v1": "env: CellNetwork"}))


def test_the_file_is_read_from_disk_with_its_path_in_every_place(tmp_path: Path) -> None:
    path = tmp_path / "cartpole.yaml"
    path.write_text(cartpole(**{"run: PPO": "run: PP0"}))
    exp = load_experiment(path)
    (problem,) = validate(exp, FACTS)
    assert problem.where == f"{path}:3"


# --- the table of bad files -----------------------------------------------------------------
#
# Each: what is wrong, the file, and every (line, message, fix) it gets.

BAD: list[tuple[str, str, list[tuple[int, str, str]]]] = [
    (
        "unknown algorithm",
        cartpole(**{"run: PPO": "run: PP0"}),
        [(3, "unknown algorithm 'PP0'", "did you mean 'PPO'?")],
    ),
    (
        "an algorithm's name in lower case",
        PENDULUM_SAC.replace("run: SAC", "run: sac"),
        [(3, "unknown algorithm 'sac'", "did you mean 'SAC'?")],
    ),
    (
        "unknown env id",
        cartpole(**{"env: CartPole-v1": "env: CartPole-v2"}),
        [(2, "unknown env id 'CartPole-v2'", "did you mean 'CartPole-v1'?")],
    ),
    (
        "an env the image cannot load",
        cartpole(**{"env: CartPole-v1": "env: Humanoid-v5"}),
        [
            (
                2,
                "env 'Humanoid-v5' is registered but does not load in the image: "
                "DependencyNotInstalled: MuJoCo is not installed, run "
                '`pip install "gymnasium[mujoco]"`',
                "use an image whose Python has what it needs, or another env",
            )
        ],
    ),
    (
        "unknown config key",
        cartpole(**{"lr: 3e-4": "lrr: 3e-4"}),
        [(10, "unknown config key `lrr` for PPO", "did you mean 'lr'?")],
    ),
    (
        "a key of another algorithm (PPO's clip_param for SAC)",
        PENDULUM_SAC.replace("tau: 0.005", "clip_param: 0.2"),
        [(11, "unknown config key `clip_param` for SAC", "did you mean 'clip_rewards'?")],
    ),
    (
        "old API stack: num_workers",
        cartpole(**{"gamma: 0.99": "num_workers: 2"}),
        [
            (
                9,
                "config.num_workers is a key of RLlib's old API stack",
                "write `num_env_runners` instead "
                "(RLlib: _translate_special_keys: num_workers -> num_env_runners)",
            )
        ],
    ),
    (
        "old API stack: num_sgd_iter",
        cartpole(**{"num_epochs: 6": "num_sgd_iter: 6"}),
        [
            (
                12,
                "config.num_sgd_iter is a key of RLlib's old API stack",
                "write `num_epochs` instead (RLlib: AlgorithmConfig.training(num_sgd_iter=..): "
                "config.training(num_sgd_iter=..) -> config.training(num_epochs=..))",
            )
        ],
    ),
    (
        "old API stack: sgd_minibatch_size",
        cartpole(**{"minibatch_size: 128": "sgd_minibatch_size: 128"}),
        [
            (
                13,
                "config.sgd_minibatch_size is a key of RLlib's old API stack",
                "write `minibatch_size` instead "
                "(RLlib: PPOConfig.sgd_minibatch_size: DEPRECATED_VALUE)",
            )
        ],
    ),
    (
        "old API stack, no new-stack setting",
        cartpole(**{"entropy_coeff: 0.0": "vf_share_layers: true"}),
        [
            (
                16,
                "config.vf_share_layers is a key of RLlib's old API stack",
                "remove it: the new stack has no setting for it (RLlib: "
                "PPOConfig.training(vf_share_layers=..): deprecated; "
                "PPOConfig.vf_share_layers: DEPRECATED_VALUE)",
            )
        ],
    ),
    (
        "the old API stack's model settings",
        cartpole(**{"        _model_config:\n": "        model:\n"}),
        [
            (
                17,
                "config.model is the old API stack's model settings (ModelV2): the new "
                "stack's RLModule does not read it",
                "write `model_config:` instead, with RLlib's DefaultModelConfig fields "
                "(e.g. `fcnet_hiddens: [256, 256]`, `fcnet_activation: relu`)",
            )
        ],
    ),
    (
        "a misspelt model setting",
        PENDULUM_SAC.replace("fcnet_hiddens: [256", "fcnet_hidens: [256"),
        [(21, "unknown key `model_config.fcnet_hidens`", "did you mean 'fcnet_hiddens'?")],
    ),
    (
        "a model setting swept",
        PENDULUM_SAC.replace("fcnet_activation: relu", "fcnet_activation: {choice: [relu, tanh]}"),
        [
            (
                22,
                "config.model_config.fcnet_activation: the model's settings are not swept",
                "give one value",
            )
        ],
    ),
    (
        "model_config not a mapping",
        PENDULUM_SAC.replace(
            "model_config:\n            fcnet_hiddens: [256, 256]\n"
            "            fcnet_activation: relu",
            "model_config: [256, 256]",
        ),
        [
            (
                20,
                "config.model_config: list [256, 256], not a mapping of the model's settings",
                "write `model_config:` then one `key: value` per line (RLlib's DefaultModelConfig "
                "fields, e.g. `fcnet_hiddens: [256, 256]`); it is not swept",
            )
        ],
    ),
    (
        "a number written as text",
        cartpole(**{"lr: 3e-4": 'lr: "3e-4x"'}),
        [
            (
                10,
                "config.lr: text '3e-4x', PPO's lr is a number (default 5e-05)",
                "write a number",
            )
        ],
    ),
    (
        "the seed in config",
        cartpole(**{"gamma: 0.99": "seed: 7"}),
        [(9, "config.seed: each run's seed comes from `seeds:`", "write `seeds: [...]` instead")],
    ),
    (
        "a resource set twice",
        cartpole(**{"gamma: 0.99": "num_env_runners: 4"}),
        [
            (
                9,
                "config.num_env_runners and resources.env_runners both set it",
                "keep one of them",
            )
        ],
    ),
    (
        "unknown key under the name, and so no stop",
        cartpole(**{"    stop:\n": "    stopp:\n"}),
        [
            (
                1,
                "no `stop:` (when to stop)",
                "add it under `cartpole-ppo:`, e.g. `stop: {training_iteration: 100}`",
            ),
            (4, "unknown key `stopp` under `cartpole-ppo`", "did you mean 'stop'?"),
        ],
    ),
    (
        "no run",
        cartpole(**{"    run: PPO\n": ""}),
        [(1, "no `run:` (the algorithm)", "add it under `cartpole-ppo:`, e.g. `run: PPO`")],
    ),
    (
        "run and env written but empty",
        cartpole(**{"run: PPO": "run:", "env: CartPole-v1": "env:"}),
        [
            (
                2,
                "env: nothing is not an environment id",
                "a registered gymnasium id, e.g. CartPole-v1",
            ),
            (
                3,
                "run: nothing is not an algorithm's name",
                "one of: APPO, BC, CQL, DQN, DreamerV3, IMPALA, IQL, MARWIL, PPO, SAC",
            ),
        ],
    ),
    (
        "stop is not a mapping",
        "x:\n  env: CartPole-v1\n  run: PPO\n  stop: 100\n",
        [
            (
                4,
                "stop: int 100, not a mapping of metric: number",
                "write e.g. `stop: {training_iteration: 100}`",
            )
        ],
    ),
    (
        "seeds not a list",
        cartpole(**{"seeds: [0, 1, 2]": "seeds: 3"}),
        [
            (
                19,
                "seeds: int 3, not a list of integers",
                "write e.g. `seeds: [0, 1, 2]` (one run per seed)",
            )
        ],
    ),
    (
        "a seed not a whole number, one twice",
        cartpole(**{"seeds: [0, 1, 2]": "seeds:\n      - 0\n      - one\n      - 0"}),
        [
            (19, "seeds: 0 more than once", "give each seed once"),
            (
                21,
                "seeds: text 'one' is not a whole number >= 0",
                "write each seed as a whole number, e.g. `seeds: [0, 1, 2]`",
            ),
        ],
    ),
    (
        "checkpoint frequency 0",
        cartpole(**{"checkpoint_frequency: 10": "checkpoint_frequency: 0"}),
        [
            (
                20,
                "checkpoint_frequency: int 0, not a whole number >= 1",
                "write the number of training iterations between checkpoints, e.g. 10",
            )
        ],
    ),
    (
        "evaluation: a misspelt key",
        cartpole(**{"episodes: 20": "episode: 20"}),
        [(22, "unknown key `evaluation.episode`", "did you mean 'episodes'?")],
    ),
    (
        "evaluation: more videos than episodes",
        cartpole(**{"video: 2": "video: 30"}),
        [(23, "evaluation.video: 30 recorded episodes of 20 evaluated", "record at most 20")],
    ),
    (
        "resources: a misspelt key, a runner of no CPU",
        cartpole(
            **{
                "env_runners: 2": "env_runner: 2",
                "cpus_per_env_runner: 1": "cpus_per_env_runner: 0",
            }
        ),
        [
            (25, "unknown key `resources.env_runner`", "did you mean 'env_runners'?"),
            (26, "resources.cpus_per_env_runner: int 0, not a number > 0", "write a number > 0"),
        ],
    ),
]


@pytest.mark.parametrize(("what", "text", "expected"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_file_gets_its_message(
    what: str, text: str, expected: list[tuple[int, str, str]]
) -> None:
    assert problems(text) == expected
    # positive control: the table's good file has none of them
    assert problems(CARTPOLE_PPO) == [] and problems(PENDULUM_SAC) == []


def test_every_problem_is_one_input_error_with_file_line_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(cartpole(**{"run: PPO": "run: PP0", "env: CartPole-v1": "env: CartPol-v1"}))
    with pytest.raises(InputError) as caught:
        check(load_experiment(path), FACTS)
    error = caught.value
    assert error.exit_code == 2
    assert error.where == f"{path}:2"
    assert error.message == (
        "2 problems in the experiment file:\n"
        f"  {path}:2: unknown env id 'CartPol-v1' (did you mean 'CartPole-v1'?)\n"
        f"  {path}:3: unknown algorithm 'PP0' (did you mean 'PPO'?)"
    )
    assert error.fix == "fix each line listed"
    # one problem: its own message and fix
    path.write_text(cartpole(**{"run: PPO": "run: PP0"}))
    with pytest.raises(InputError) as caught:
        check(load_experiment(path), FACTS)
    assert (caught.value.where, caught.value.message, caught.value.fix) == (
        f"{path}:3",
        "unknown algorithm 'PP0'",
        "did you mean 'PPO'?",
    )
    check(parse(CARTPOLE_PPO), FACTS)  # positive control: a good file raises nothing


# --- files that are no experiment at all: refused when read --------------------------------

NOT_AN_EXPERIMENT: list[tuple[str, str, int, str]] = [
    ("not YAML", "x:\n  env: [CartPole\n  run: PPO\n", 3, "not valid YAML"),
    ("empty", "", 1, "not an experiment (no `NAME:` mapping at the top)"),
    ("a list", "- env: CartPole-v1\n", 1, "not an experiment (no `NAME:` mapping at the top)"),
    (
        "two experiments",
        "a:\n  run: PPO\nb:\n  run: SAC\n",
        3,
        "2 experiments in one file (a, b); provisioner runs one per file",
    ),
    ("the name holds a list", "a:\n  - PPO\n", 1, "`a:` holds list, not the experiment's keys"),
    ("a key twice", "a:\n  run: PPO\n  run: SAC\n", 3, "a.run appears twice (first on line 2)"),
    ("a list as a key", "a:\n  [1, 2]: PPO\n", 2, "a: a key must be a name, not [1, 2]"),
    ("an anchor that holds itself", "a: &x\n  b: *x\n", 1, "nested more than 64 levels deep"),
]


@pytest.mark.parametrize(
    ("what", "text", "line", "message"), NOT_AN_EXPERIMENT, ids=[n[0] for n in NOT_AN_EXPERIMENT]
)
def test_a_file_that_is_no_experiment_is_refused_with_its_line(
    tmp_path: Path, what: str, text: str, line: int, message: str
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_experiment(path)
    assert caught.value.where == f"{path}:{line}"
    assert caught.value.message.startswith(message)
    assert caught.value.fix


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_experiment(tmp_path / "nowhere.yaml")
    assert caught.value.where == str(tmp_path / "nowhere.yaml")


# --- the cluster ----------------------------------------------------------------------------


def nodes(*cpus: float, gpus: float = 0) -> ClusterCapacity:
    return ClusterCapacity(tuple(NodeCapacity(c, gpus) for c in cpus))


# Each: what is wrong, the file, a cluster that cannot give it and its (line, message, fix),
# and a cluster that can (the positive control: nothing).
BAD_FOR_CLUSTER: list[
    tuple[str, str, ClusterCapacity, list[tuple[int, str, str]], ClusterCapacity]
] = [
    (
        "more env runners than CPUs",
        cartpole(
            **{
                "env_runners: 2": "env_runners: 4",
                "cpus_per_env_runner: 1": "cpus_per_env_runner: 2",
            }
        ),
        nodes(4, 4),
        [
            (
                25,
                "the run needs 9 CPUs (1 for the main process, 8 for 4 env runners of 2); "
                "the cluster has 8 on 2 node(s)",
                "at most 3 env runners of 2 CPUs fit: lower resources.env_runners or "
                "cpus_per_env_runner, or add nodes",
            )
        ],
        nodes(4, 5),
    ),
    (
        "the learners' CPUs count too",
        cartpole(
            **{"learners: 0": "learners: 2", "cpus_per_env_runner: 1": "cpus_per_env_runner: 3"}
        ),
        nodes(4, 4),
        [
            (
                25,
                "the run needs 9 CPUs (1 for the main process, 6 for 2 env runners of 3, "
                "2 for 2 learners of 1); the cluster has 8 on 2 node(s)",
                "at most 1 env runner of 3 CPUs fit: lower resources.env_runners or "
                "cpus_per_env_runner, or add nodes",
            )
        ],
        nodes(4, 5),
    ),
    (
        "an env runner bigger than any node",
        cartpole(**{"cpus_per_env_runner: 1": "cpus_per_env_runner: 3"}),
        nodes(2, 2, 2, 2),
        [
            (
                26,
                "an env runner of 3 CPUs fits on no node (the largest has 2)",
                "at most 2 CPUs per env runner",
            )
        ],
        nodes(3, 3, 2),
    ),
    (
        "a GPU learner on a cluster without GPUs",
        cartpole(**{"learners: 0": "learners: 1", "gpus_per_learner: 0": "gpus_per_learner: 1"}),
        nodes(8),
        [
            (
                28,
                "1 GPU(s) asked for (gpus_per_learner 1); the cluster has no GPU",
                "set gpus_per_learner to 0 (learn on CPUs), or add a node with a GPU",
            )
        ],
        nodes(8, gpus=1),
    ),
    (
        "more GPUs than the cluster has",
        cartpole(**{"learners: 0": "learners: 2", "gpus_per_learner: 0": "gpus_per_learner: 1"}),
        nodes(8, gpus=1),
        [
            (
                28,
                "2 GPUs asked for; the cluster has 1",
                "lower resources.learners or gpus_per_learner, or add GPUs",
            )
        ],
        nodes(4, 4, gpus=1),
    ),
]


@pytest.mark.parametrize(
    ("what", "text", "small", "expected", "enough"),
    BAD_FOR_CLUSTER,
    ids=[b[0] for b in BAD_FOR_CLUSTER],
)
def test_resources_the_cluster_cannot_give(
    what: str,
    text: str,
    small: ClusterCapacity,
    expected: list[tuple[int, str, str]],
    enough: ClusterCapacity,
) -> None:
    assert problems(text, small) == expected
    assert problems(text, enough) == []
    assert problems(text) == []  # without a cluster, nothing of it is judged


def test_the_cluster_is_judged_on_the_algorithms_defaults_where_the_file_says_nothing() -> None:
    """PPO's default is 2 env runners (RLlib's PPOConfig): a file without `resources`
    needs 3 CPUs; the line named is the config's (or the name's: the file has neither)."""
    text = PENDULUM_SAC.replace("run: SAC", "run: PPO").replace(
        "    resources:\n        env_runners: 1\n", ""
    )
    text = re.sub(r"    config:\n(        .*\n|            .*\n)+", "", text)
    ((line, message, _),) = problems(text, ClusterCapacity((NodeCapacity(2),)))
    assert line == 1
    assert message.startswith("the run needs 3 CPUs (1 for the main process, 2 for 2 env runners")


# --- the facts ------------------------------------------------------------------------------


def test_the_golden_facts_hold_what_validation_relies_on() -> None:
    assert {"PPO", "APPO", "IMPALA", "DQN", "SAC"} <= set(FACTS.algorithms)
    assert {"CartPole-v1", "Pendulum-v1", "Humanoid-v5"} <= set(FACTS.envs)
    ppo = FACTS.algorithms["PPO"]
    assert ppo.config_class == "ray.rllib.algorithms.ppo.ppo.PPOConfig"
    assert ppo.old_keys["num_rollout_workers"].new == ("num_env_runners",)
    assert ppo.stored_as("train_batch_size_per_learner") == "_train_batch_size_per_learner"
    assert FACTS.envs["CartPole-v1"].error is None


def test_the_golden_facts_are_of_the_images_ray_and_gymnasium() -> None:
    """The golden capture is of the versions the image's lock pins: a bump of either
    fails here until the facts are captured again (see provisioner/experiment/facts.py)."""
    for lock in ("requirements.lock", "requirements-cuda.lock"):
        text = (ROOT / "images" / lock).read_text()
        for package in ("ray", "gymnasium"):
            pinned = re.search(rf"^{package}==([^\s+]+)", text, flags=re.M)
            assert pinned, f"{package} in {lock}"
            assert FACTS.versions[package] == pinned.group(1), (lock, package)


def test_the_golden_facts_are_this_pythons_capture() -> None:
    """Run the capture as the image will (the script on stdin) with the Ray and gymnasium
    installed beside the tests: the same document as the golden file, byte for byte."""
    done = subprocess.run(
        [sys.executable, "-"],
        input=capture_source(),
        capture_output=True,
        check=True,
        timeout=300,
    )
    assert json.loads(done.stdout) == json.loads(GOLDEN.read_text())
    assert done.stdout.decode() == GOLDEN.read_text()


def test_facts_of_another_schema_are_refused() -> None:
    data = json.loads(GOLDEN.read_text())
    data["schema"] = 99
    with pytest.raises(InputError) as caught:
        Facts.from_json(data)
    assert "schema 99" in caught.value.message


# --- against RLlib itself -------------------------------------------------------------------


@pytest.fixture(scope="module")
def rllib() -> Iterator[Any]:
    logging.disable(logging.WARNING)  # RLlib's deprecation chatter
    import ray.rllib.algorithms.ppo as ppo
    import ray.rllib.algorithms.sac as sac

    yield {"PPO": ppo, "SAC": sac}
    logging.disable(logging.NOTSET)


def test_every_key_the_validator_accepts_for_ppo_is_taken_by_rllib(rllib: Any) -> None:
    """One file whose config holds every key the validator accepts for PPO, each at its
    default: it passes; RLlib's `PPOConfig().update_from_dict` takes each key; and a changed
    number lands where RLlib's own `to_dict()` reads it (the key is real, not just set)."""
    ppo = FACTS.algorithms["PPO"]
    config = {k: copy.deepcopy(ppo.defaults[ppo.stored_as(k)]) for k in ppo.keys}
    config.pop("seed")  # comes from `seeds:`
    config.pop("env")  # comes from `env:`
    exp = parse(cartpole())
    exp = Experiment(**{**exp.__dict__, "config": config, "resources": None})
    assert validate(exp, FACTS) == []
    assert len(config) > 200
    numbers = 0
    for key, value in config.items():
        with_keys(rllib["PPO"].PPOConfig(), {key: copy.deepcopy(value)})
        if isinstance(value, int | float) and not isinstance(value, bool):
            probe = value + 7 if isinstance(value, int) else value * 0.5 + 0.125
            got = with_keys(rllib["PPO"].PPOConfig(), {key: probe}).to_dict()
            assert got[ppo.stored_as(key)] == probe, key
            numbers += 1
    assert numbers > 50


def test_the_old_keys_refused_are_ones_rllib_ignores_or_refuses(rllib: Any) -> None:
    """Why the validator refuses them: given to RLlib's `update_from_dict`, an old key is
    dropped without a word (the run would quietly use the default) or raises."""
    PPOConfig = rllib["PPO"].PPOConfig
    default = PPOConfig().to_dict()
    for old, new, value in (
        ("num_sgd_iter", "num_epochs", 30),
        ("sgd_minibatch_size", "minibatch_size", 64),
    ):
        assert FACTS.algorithms["PPO"].old_keys[old].new == (new,)
        assert PPOConfig().update_from_dict({old: value}).to_dict()[new] == default[new]
        assert PPOConfig().update_from_dict({new: value}).to_dict()[new] == value  # control
    with pytest.raises(ValueError, match="num_rollout_workers"):
        PPOConfig().update_from_dict({"num_rollout_workers": 2})


@pytest.mark.parametrize(("text", "name"), [(CARTPOLE_PPO, "PPO"), (PENDULUM_SAC, "SAC")])
def test_the_resolved_config_is_the_one_rllib_resolves(rllib: Any, text: str, name: str) -> None:
    """`resolved_config` (pure, from the facts) is what RLlib's own config class makes of
    the file's keys, key for key, in `to_dict()`'s JSON-able form."""
    from ray._common.deprecation import DEPRECATED_VALUE

    from provisioner.experiment.capture_facts import plain

    exp = parse(text)
    for seed in exp.seeds:
        config_class = getattr(rllib[name], f"{name}Config")
        real = with_keys(config_class(), copy.deepcopy(overrides(exp, seed))).to_dict()
        expected = {k: plain(v) for k, v in real.items() if v is not DEPRECATED_VALUE}
        assert resolved_config(exp, FACTS, seed) == expected
    assert resolved_config(exp, FACTS)["seed"] == exp.seeds[0]
    json.dumps(resolved_config(exp, FACTS))  # JSON-able, to be kept in results/JOB


@pytest.mark.parametrize(
    "resources",
    [
        {},
        {"env_runners": 3, "cpus_per_env_runner": 2},
        {"env_runners": 0, "learners": 2},
        {"learners": 2, "gpus_per_learner": 1},
        {"learners": 0, "gpus_per_learner": 1},
        {"env_runners": 1, "learners": 1, "gpus_per_learner": 0.5},
    ],
)
def test_the_bundles_are_the_ones_rllib_asks_for(rllib: Any, resources: dict[str, Any]) -> None:
    exp = parse(cartpole())
    exp = Experiment(**{**exp.__dict__, "resources": resources})
    assert validate(exp, FACTS) == []
    PPO = rllib["PPO"].PPO
    config = rllib["PPO"].PPOConfig().update_from_dict(overrides(exp, 0))
    real = [
        {"CPU": b.get("CPU", 0.0), "GPU": b.get("GPU", 0.0)}
        for b in PPO.default_resource_request(config).bundles
    ]
    ours = [{"CPU": b.cpus, "GPU": b.gpus} for b in bundles(resolved_config(exp, FACTS))]
    assert ours == real


def table() -> str:
    """The bad files and their messages, as the issue's note shows them (markdown)."""
    rows = ["| what is wrong | line | message | fix |", "|---|---|---|---|"]
    for what, _, expected in BAD:
        for line, message, fix in expected:
            cells = [what, str(line), message, fix]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for what, _, small, expected, _ in BAD_FOR_CLUSTER:
        shown = ", ".join(
            f"{n.cpus:g} CPUs" + (f" {n.gpus:g} GPU" if n.gpus else "") for n in small.nodes
        )
        for line, message, fix in expected:
            cells = [f"{what} (nodes: {shown})", str(line), message, fix]
            rows.append("| " + " | ".join(cells) + " |")
    for what, _, line, message in NOT_AN_EXPERIMENT:
        rows.append(f"| {what} (refused when read) | {line} | {message} | |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
