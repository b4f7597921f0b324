"""The algorithm config that will run, and what it asks of the cluster (pure)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.experiment.facts import Facts
from provisioner.experiment.file import Experiment

# `resources:` of the file -> the AlgorithmConfig key it sets
RESOURCE_KEYS: Mapping[str, str] = {
    "env_runners": "num_env_runners",
    "cpus_per_env_runner": "num_cpus_per_env_runner",
    "learners": "num_learners",
    "gpus_per_learner": "num_gpus_per_learner",
}


def overrides(exp: Experiment, seed: int | None = None) -> dict[str, Any]:
    """The keys the file sets, as AlgorithmConfig keys: `config`, `env`, the resources,
    and the run's seed."""
    result: dict[str, Any] = dict(exp.config) if isinstance(exp.config, dict) else {}
    if exp.env is not None:
        result["env"] = exp.env
    if isinstance(exp.resources, dict):
        for key, value in exp.resources.items():
            if key in RESOURCE_KEYS:
                result[RESOURCE_KEYS[key]] = value
    if seed is not None:
        result["seed"] = seed
    return result


def resolved_config(exp: Experiment, facts: Facts, seed: int | None = None) -> dict[str, Any]:
    """The algorithm's defaults (as the image's RLlib has them) overlaid by the file's keys:
    the config that will run, JSON-able, in `AlgorithmConfig.to_dict()`'s shape (a settable
    property stored under its key: `train_batch_size_per_learner` as
    `_train_batch_size_per_learner`), so `update_from_dict` of it rebuilds that config.
    `seed`: one run's seed (default the file's first). For a file `validate` passes."""
    algorithm = facts.algorithms[str(exp.run)]
    if seed is None and isinstance(exp.seeds, list) and exp.seeds:
        seed = exp.seeds[0]
    result = copy.deepcopy(dict(algorithm.defaults))
    for key, value in overrides(exp, seed).items():
        result[algorithm.stored_as(key)] = copy.deepcopy(value)
    return result


@dataclass(frozen=True)
class Bundle:
    """One resource bundle the algorithm's placement group asks for."""

    what: str  # "main process", "env runner", "evaluation env runner", "learner"
    cpus: float
    gpus: float


def _cpus_per_learner(config: Mapping[str, Any]) -> float:
    if config["num_cpus_per_learner"] != "auto":
        return float(config["num_cpus_per_learner"])
    return 1.0 if not config["num_gpus_per_learner"] else 0.0


def bundles(config: Mapping[str, Any]) -> list[Bundle]:
    """The bundles RLlib's `Algorithm.default_resource_request` asks for on the new stack,
    CPUs and GPUs only (`ray.rllib.algorithms.utils`: `_get_main_process_bundle`,
    `_get_env_runner_bundles`, `_get_learner_bundles`; evaluation env runners when
    evaluation runs on their own). The unit tests compare it with RLlib's own."""
    learners = int(config["num_learners"])
    aggregators = int(config.get("num_aggregator_actors_per_learner") or 0)
    if learners == 0:
        main = Bundle(
            "main process",
            max(_cpus_per_learner(config), float(config["num_cpus_for_main_process"])),
            float(config["num_gpus_per_learner"]),
        )
    else:
        main = Bundle("main process", float(config["num_cpus_for_main_process"]), 0.0)
    per_runner = (
        float(config["num_cpus_per_env_runner"]),
        float(config["num_gpus_per_env_runner"]),
    )
    result = [main]
    result += [Bundle("env runner", *per_runner) for _ in range(int(config["num_env_runners"]))]
    if config.get("evaluation_interval") and int(config.get("evaluation_num_env_runners") or 0):
        eval_runners = int(config["evaluation_num_env_runners"])
        result += [Bundle("evaluation env runner", *per_runner) for _ in range(eval_runners)]
    if learners == 0:
        result += [Bundle("aggregator actor", 1.0, 0.0) for _ in range(aggregators)]
    else:
        cpus = _cpus_per_learner(config) + aggregators
        gpus = float(config["num_gpus_per_learner"])
        result += [Bundle("learner", cpus, gpus) for _ in range(learners)]
    return result
