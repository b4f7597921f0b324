"""Sweeps in an experiment file: the search spaces and scheduler judged before anything is
sent (each bad file's message, with a positive control), the number of trials against
Tune's own variant generator, and the runner's Tune objects against Tune itself.

The facts are the golden capture (tests/unit/golden/experiment/facts.json); the runner's
side runs with this venv's Ray and RLlib (the image's versions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.experiment import load_facts, parse_experiment, validate
from provisioner.experiment import runner as runner_module
from provisioner.experiment.resolve import overrides
from provisioner.experiment.search import space_problem, spaces, trial_count
from provisioner.jobs.experiment import runner_args

ROOT = Path(__file__).resolve().parents[2]
FACTS = load_facts(ROOT / "tests" / "unit" / "golden" / "experiment" / "facts.json")
FILE = Path("sweep.yaml")

SWEEP = """\
cartpole-sweep:
    env: CartPole-v1
    run: PPO
    stop: {training_iteration: 4}
    config:
        lr: {grid_search: [0.0001, 0.001]}
        train_batch_size_per_learner: {grid_search: [500, 1000]}
        minibatch_size: 128
        num_epochs: 2
    seeds: [1, 2]
    checkpoint_frequency: 1
    resources: {env_runners: 1}
"""


def problems(text: str) -> list[str]:
    return [
        f"{p.line}: {p.message} | {p.fix}" for p in validate(parse_experiment(FILE, text), FACTS)
    ]


def test_a_good_sweep_passes_and_makes_eight_trials() -> None:
    exp = parse_experiment(FILE, SWEEP)
    assert validate(exp, FACTS) == []
    assert trial_count(exp.config, len(exp.seeds), exp.num_samples) == 8
    assert set(spaces(exp.config)) == {"lr", "train_batch_size_per_learner"}


BAD = [
    ("lr: {grid_search: [0.0001, 0.001]}", "lr: {grid_search: 0.1}", 6,
     "grid_search takes a non-empty list"),
    ("lr: {grid_search: [0.0001, 0.001]}", "lr: {grid_serch: [0.1, 0.2]}", 6,
     "did you mean 'grid_search'?"),
    ("lr: {grid_search: [0.0001, 0.001]}", "lr: {uniform: [0.1, 0.01]}", 6,
     "low must be below high"),
    ("lr: {grid_search: [0.0001, 0.001]}", "lr: {loguniform: [0, 0.01]}", 6,
     "both ends must be above 0"),
    ("lr: {grid_search: [0.0001, 0.001]}", "lr: {choice: [fast, slow]}", 6,
     "PPO's lr is a number"),
    ("num_epochs: 2", "num_epochs: {randint: [1.5, 4]}", 9, "whole numbers"),
    ("resources: {env_runners: 1}", "resources: {env_runners: 1}\n    num_samples: 0", 13,
     "num_samples: int 0"),
    ("resources: {env_runners: 1}", "resources: {env_runners: 1}\n    num_samples: 3", 13,
     "no random space in config"),
    ("resources: {env_runners: 1}", "resources: {env_runners: 1}\n    mode: maximum", 13,
     "write `mode: max` or `mode: min`"),
    ("resources: {env_runners: 1}",
     "resources: {env_runners: 1}\n    scheduler: {type: hyperband}", 13,
     "scheduler type `hyperband` is not one provisioner runs"),
    ("resources: {env_runners: 1}",
     "resources: {env_runners: 1}\n    scheduler: {type: asha, max_iters: 8}", 13,
     "did you mean 'max_t'?"),
    ("resources: {env_runners: 1}",
     "resources: {env_runners: 1}\n    scheduler: {type: pbt, perturbation_interval: 2}", 13,
     "pbt needs hyperparam_mutations"),
    ("    checkpoint_frequency: 1\n", "",  # pbt without checkpoints
     None, "pbt copies the best trials' checkpoints"),
    ("minibatch_size: 128", "minibatch_size: 128\n        num_env_runners: {grid_search: [1, 2]}",
     None, "the resources are not swept"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "line", "said"), BAD, ids=[b[3][:40] for b in BAD])
def test_each_bad_sweep_is_refused_with_its_line(
    old: str, new: str, line: int | None, said: str
) -> None:
    text = SWEEP.replace(old, new)
    if "checkpoints" in said:
        text += "    scheduler: {type: pbt, hyperparam_mutations: {lr: [0.001, 0.0001]}}\n"
    if "resources are not swept" in said:
        text = text.replace("    resources: {env_runners: 1}\n", "")
    assert text != SWEEP
    found = problems(text)
    assert any(said in p for p in found), found
    if line is not None:
        assert any(p.startswith(f"{line}: ") and said in p for p in found), found
    assert problems(SWEEP) == []  # the positive control


def test_asha_and_pbt_files_pass() -> None:
    asha = SWEEP + "    scheduler: {type: asha, max_t: 4, grace_period: 1, reduction_factor: 2}\n"
    pbt = SWEEP + (
        "    scheduler:\n        type: pbt\n        perturbation_interval: 2\n"
        "        hyperparam_mutations: {lr: {loguniform: [1.0e-5, 1.0e-3]}, num_epochs: [2, 4]}\n"
    )
    assert problems(asha) == [] and problems(pbt) == []


def test_the_trial_count_is_tunes_own() -> None:
    from ray.tune.search.variant_generator import generate_variants

    text = SWEEP.replace("num_epochs: 2", "num_epochs: {randint: [2, 5]}") + "    num_samples: 3\n"
    exp = parse_experiment(FILE, text)
    assert validate(exp, FACTS) == []
    spec = json.loads(runner_args(exp)[1])
    _, config, _ = runner_module.build(spec)
    variants = list(generate_variants(config.to_dict()))
    assert trial_count(exp.config, len(exp.seeds), exp.num_samples) == len(variants) * 3 == 24


def test_the_runner_gives_tune_its_own_spaces_and_schedulers() -> None:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
    from ray.tune.search.sample import Categorical, Float, Integer

    assert runner_module.to_tune({"grid_search": [1, 2]}) == tune.grid_search([1, 2])
    assert isinstance(runner_module.to_tune({"choice": [1, 2]}), Categorical)
    assert isinstance(runner_module.to_tune({"loguniform": [1e-5, 1e-3]}), Float)
    assert isinstance(runner_module.to_tune({"randint": [1, 4]}), Integer)
    assert runner_module.to_tune({"gamma": 0.9}) == {"gamma": 0.9}  # a plain mapping stays
    spec = {
        "scheduler": {"type": "asha", "max_t": 8, "grace_period": 2},
        "max_concurrent": 3,
        "num_samples": 2,
    }
    config = runner_module.tune_config(spec)
    assert isinstance(config.scheduler, ASHAScheduler)
    assert config.max_concurrent_trials == 3 and config.num_samples == 2
    assert config.metric == "env_runners/episode_return_mean" and config.mode == "max"
    pbt = runner_module.scheduler_of(
        {"scheduler": {"type": "pbt", "perturbation_interval": 2,
                       "hyperparam_mutations": {"lr": {"uniform": [1e-4, 1e-3]}}}}
    )  # fmt: skip
    assert isinstance(pbt, PopulationBasedTraining)
    assert runner_module.tune_config({}).scheduler is None


def test_the_runner_args_carry_a_sweep_only_when_there_is_one() -> None:
    plain = json.loads(runner_args(parse_experiment(FILE, SWEEP))[1])
    assert not {"num_samples", "scheduler", "metric", "mode", "max_concurrent"} & set(plain)
    asha = (
        SWEEP
        + "    scheduler: {type: asha, max_t: 4}\n    metric: env_runners/episode_return_mean\n"
    )
    body = json.loads(runner_args(parse_experiment(FILE, asha), max_concurrent=2)[1])
    assert body["scheduler"] == {"type": "asha", "max_t": 4} and body["max_concurrent"] == 2
    assert body["config"]["lr"] == {"grid_search": [0.0001, 0.001]}
    assert overrides(parse_experiment(FILE, SWEEP))["lr"] == {"grid_search": [0.0001, 0.001]}


def test_retries_let_tune_start_a_cut_off_trial_again_within_the_run() -> None:
    """`submit --retries N` of an experiment file: Tune's FailureConfig(max_failures=N), so
    a trial a lost node ended goes on from its latest checkpoint on the nodes that remain."""
    exp = parse_experiment(FILE, SWEEP)
    assert "max_failures" not in json.loads(runner_args(exp, max_failures=0)[1])
    spec = json.loads(runner_args(exp, max_failures=2)[1])
    assert spec["max_failures"] == 2
    _, _, run_args = runner_module.build(spec)
    assert run_args["failure_config"].max_failures == 2
    _, _, plain = runner_module.build(json.loads(runner_args(exp)[1]))
    assert "failure_config" not in plain


def test_space_problems() -> None:
    assert space_problem("choice", []) is not None
    assert space_problem("uniform", [0.1, 0.2]) is None
    assert space_problem("randint", [1, 1]) is not None


class _Result:
    """What the runner reads of one of Tune's Result objects (pure logic under test)."""

    def __init__(self, name: str, iterations: int, final: float, since: int, **config: object):
        self.path = f"/storage/exp/{name}"
        self.error = None
        self.config = config
        self.metrics_dataframe = None
        self.metrics = {
            "training_iteration": iterations,
            "iterations_since_restore": since,
            "env_runners": {"episode_return_mean": final},
            "node_ip": "10.250.77.11",
        }


def test_the_sweeps_summary_marks_the_best_the_early_stopped_and_the_restored() -> None:
    grid = [
        _Result("t0", 6, 40.0, 6, lr=1e-4, _train_batch_size_per_learner=200, seed=1),
        _Result("t1", 2, 20.0, 2, lr=3e-4, _train_batch_size_per_learner=200, seed=1),
        _Result("t2", 6, 90.0, 3, lr=3e-4, _train_batch_size_per_learner=400, seed=1),
    ]
    spec = {"stop": {"training_iteration": 6}, "scheduler": {"type": "asha", "max_t": 6}}
    body = runner_module.summary(grid, spec, ["lr", "train_batch_size_per_learner"])
    by = {t["trial"]: t for t in body["trials"]}
    assert body["best"] == "t2" and by["t2"]["best_trial"] and not by["t0"]["best_trial"]
    assert by["t1"]["stopped_early"] and not by["t0"]["stopped_early"]
    assert by["t2"]["restored"] and not by["t0"]["restored"]
    assert by["t2"]["params"] == {"lr": 3e-4, "train_batch_size_per_learner": 400}
    lowest = runner_module.summary(grid, {**spec, "mode": "min"}, ["lr"])
    assert lowest["best"] == "t1"


@pytest.mark.parametrize(
    "example", sorted((ROOT / "examples" / "experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_experiment_file_passes(example: Path) -> None:
    from provisioner.experiment import load_experiment

    exp = load_experiment(example)
    assert validate(exp, FACTS) == [], validate(exp, FACTS)
    assert exp.run in ("PPO", "SAC") and exp.checkpoint_frequency
