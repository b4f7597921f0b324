"""An experiment file judged against the image's facts (and the cluster), before anything
is sent: every problem with its file, line and fix (pure)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.errors import InputError
from provisioner.experiment.facts import MODEL_CONFIG, Algorithm, Facts
from provisioner.experiment.file import TOP_KEYS, Experiment
from provisioner.experiment.resolve import RESOURCE_KEYS, bundles, resolved_config
from provisioner.experiment.search import (
    MODES,
    RANDOM,
    SCHEDULERS,
    SPACES,
    examples,
    looks_like_a_space,
    space_of,
    space_problem,
)

EVALUATION_KEYS = ("episodes", "video")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str
    fix: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: {self.message} ({self.fix})"


@dataclass(frozen=True)
class NodeCapacity:
    cpus: float
    gpus: float = 0.0


@dataclass(frozen=True)
class ClusterCapacity:
    """What the cluster's nodes offer Ray (plain data: CPUs and GPUs per node)."""

    nodes: tuple[NodeCapacity, ...]

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word` (case aside), if any is close (difflib)."""
    by_lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def _did_you_mean(word: str, choices: Iterable[str], otherwise: str) -> str:
    guess = closest(word, choices)
    return f"did you mean '{guess}'?" if guess else otherwise


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"text {value!r}" if isinstance(value, str) else f"{type(value).__name__} {value!r}"


class _Judge:
    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.problems: list[Problem] = []

    def add(self, keys: tuple[str, ...], message: str, fix: str) -> None:
        self.problems.append(Problem(str(self.exp.path), self.exp.line(*keys), message, fix))


def _top(j: _Judge) -> None:
    exp = j.exp
    for key in exp.unknown:
        j.add(
            (key,),
            f"unknown key `{key}` under `{exp.name}`",
            _did_you_mean(key, TOP_KEYS, f"the keys are: {', '.join(TOP_KEYS)}"),
        )
    for key, what, example in (
        ("run", "the algorithm", "run: PPO"),
        ("env", "the environment", "env: CartPole-v1"),
        ("stop", "when to stop", "stop: {training_iteration: 100}"),
    ):
        if key not in exp.written:
            j.add((), f"no `{key}:` ({what})", f"add it under `{exp.name}:`, e.g. `{example}`")


def _algorithm(j: _Judge, facts: Facts) -> Algorithm | None:
    run = j.exp.run
    if "run" not in j.exp.written:  # said by _top
        return None
    names = sorted(facts.algorithms)
    if not isinstance(run, str):
        j.add(
            ("run",),
            f"run: {_shown(run)} is not an algorithm's name",
            f"one of: {', '.join(names)}",
        )
        return None
    if run not in facts.algorithms:
        j.add(
            ("run",),
            f"unknown algorithm '{run}'",
            _did_you_mean(run, names, f"RLlib's algorithms: {', '.join(names)}"),
        )
        return None
    return facts.algorithms[run]


def _env(j: _Judge, facts: Facts) -> None:
    exp = j.exp
    env = exp.env
    if "env" not in exp.written:  # said by _top
        return
    if not isinstance(env, str):
        j.add(
            ("env",),
            f"env: {_shown(env)} is not an environment id",
            "a registered gymnasium id, e.g. CartPole-v1",
        )
        return
    if ":" in env or "." in env:
        # gymnasium's `module:Id` (the module registers it) or RLlib's class path
        # (`my_envs.Grid`): both resolved in the image, not by the registry's facts
        return
    if env not in facts.envs:
        j.add(
            ("env",),
            f"unknown env id '{env}'",
            _did_you_mean(env, facts.envs, "a gymnasium id registered in the image"),
        )
        return
    error = facts.envs[env].error
    if error:
        j.add(
            ("env",),
            f"env '{env}' is registered but does not load in the image: {error}",
            "use an image whose Python has what it needs, or another env",
        )


def _model_config(j: _Judge, value: Any, facts: Facts) -> None:
    """`config.model_config`: a mapping of DefaultModelConfig's fields, one value each."""
    at = ("config", MODEL_CONFIG)
    if not isinstance(value, dict) or space_of(value) is not None:
        j.add(
            at,
            f"config.model_config: {_shown(value)}, not a mapping of the model's settings",
            "write `model_config:` then one `key: value` per line (RLlib's DefaultModelConfig "
            "fields, e.g. `fcnet_hiddens: [256, 256]`); it is not swept",
        )
        return
    for key, inner in value.items():
        where = (*at, str(key))
        if facts.model_config_keys and key not in facts.model_config_keys:
            j.add(
                where,
                f"unknown key `model_config.{key}`",
                _did_you_mean(str(key), facts.model_config_keys, "see RLlib's DefaultModelConfig"),
            )
        elif space_of(inner) is not None or looks_like_a_space(inner) is not None:
            j.add(
                where,
                f"config.model_config.{key}: the model's settings are not swept",
                "give one value",
            )


def _config(j: _Judge, algorithm: Algorithm | None, facts: Facts) -> None:
    exp = j.exp
    config = exp.config
    if not isinstance(config, dict):
        j.add(
            ("config",),
            f"config: {_shown(config)}, not a mapping of AlgorithmConfig keys",
            "write `config:` then one `key: value` per line",
        )
        return
    if algorithm is None:
        return
    valid = set(algorithm.keys)
    for key, value in config.items():
        at = ("config", key)
        if key == MODEL_CONFIG and algorithm.stored_as(key) != key:
            _model_config(j, value, facts)
            continue
        if key == "model" and "model" not in valid:
            j.add(
                at,
                "config.model is the old API stack's model settings (ModelV2): the new "
                "stack's RLModule does not read it",
                "write `model_config:` instead, with RLlib's DefaultModelConfig fields "
                "(e.g. `fcnet_hiddens: [256, 256]`, `fcnet_activation: relu`)",
            )
            continue
        old = algorithm.old_keys.get(key)
        if old is not None:
            said = "; ".join(old.rllib)
            if old.new:
                spelled = " and ".join(f"`{n}`" for n in old.new)
                fix = f"write {spelled} instead (RLlib: {said})"
            else:
                fix = f"remove it: the new stack has no setting for it (RLlib: {said})"
            j.add(at, f"config.{key} is a key of RLlib's old API stack", fix)
            continue
        if key not in valid:
            j.add(
                at,
                f"unknown config key `{key}` for {algorithm.name}",
                _did_you_mean(
                    key, algorithm.keys, f"see {algorithm.config_class.rsplit('.', 1)[-1]}'s keys"
                ),
            )
            continue
        default = algorithm.defaults.get(algorithm.stored_as(key))
        typo = looks_like_a_space(value)
        if typo is not None:
            j.add(
                at,
                f"config.{key}: `{next(iter(value))}` is no search space",
                f"did you mean '{typo}'? (the spaces: {', '.join(SPACES)})",
            )
            continue
        space = space_of(value)
        if space is not None:
            problem = space_problem(*space)
            if problem is not None:
                j.add(at, f"config.{key}: {problem}", "see README, 'Sweeps'")
                continue
            if key in RESOURCE_KEYS.values():
                j.add(at, f"config.{key}: the resources are not swept", "give one value")
                continue
        for candidate in examples(*space) if space is not None else [value]:
            if (isinstance(default, bool) and not isinstance(candidate, bool)) or (
                _number(default) and not (_number(candidate) or candidate is None)
            ):
                kind = "true or false" if isinstance(default, bool) else "a number"
                j.add(
                    at,
                    f"config.{key}: {_shown(candidate)}, {algorithm.name}'s {key} is {kind} "
                    f"(default {default!r})",
                    f"write {kind}",
                )
                break
    if exp.env is not None and "env" in config and config["env"] != exp.env:
        j.add(
            ("config", "env"),
            f"config.env ({config['env']!r}) is not env ({exp.env!r})",
            "set the environment once, as `env:`",
        )
    if "seed" in config:
        j.add(
            ("config", "seed"),
            "config.seed: each run's seed comes from `seeds:`",
            "write `seeds: [...]` instead",
        )
    if isinstance(exp.resources, dict):
        for key, target in RESOURCE_KEYS.items():
            if key in exp.resources and target in config:
                j.add(
                    ("config", target),
                    f"config.{target} and resources.{key} both set it",
                    "keep one of them",
                )


def _seeds(j: _Judge) -> None:
    seeds = j.exp.seeds
    if not isinstance(seeds, list) or not seeds:
        j.add(
            ("seeds",),
            f"seeds: {_shown(seeds)}, not a list of integers",
            "write e.g. `seeds: [0, 1, 2]` (one run per seed)",
        )
        return
    for i, seed in enumerate(seeds):
        if not _integer(seed) or seed < 0:
            j.add(
                ("seeds", str(i)),
                f"seeds: {_shown(seed)} is not a whole number >= 0",
                "write each seed as a whole number, e.g. `seeds: [0, 1, 2]`",
            )
    twice = sorted({s for s in seeds if _integer(s) and seeds.count(s) > 1})
    if twice:
        j.add(
            ("seeds",), f"seeds: {', '.join(map(str, twice))} more than once", "give each seed once"
        )


def _checkpoint_frequency(j: _Judge) -> None:
    value = j.exp.checkpoint_frequency
    if value is not None and not (_integer(value) and value >= 1):
        j.add(
            ("checkpoint_frequency",),
            f"checkpoint_frequency: {_shown(value)}, not a whole number >= 1",
            "write the number of training iterations between checkpoints, e.g. 10",
        )


def _mapping(j: _Judge, name: str, value: Any, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        j.add(
            (name,),
            f"{name}: {_shown(value)}, not a mapping",
            f"write `{name}:` then some of: {', '.join(keys)}",
        )
        return None
    for key in value:
        if key not in keys:
            j.add(
                (name, key),
                f"unknown key `{name}.{key}`",
                _did_you_mean(key, keys, f"the keys are: {', '.join(keys)}"),
            )
    return value


def _evaluation(j: _Judge) -> None:
    ev = _mapping(j, "evaluation", j.exp.evaluation, EVALUATION_KEYS)
    if ev is None:
        return
    episodes, video = ev.get("episodes"), ev.get("video")
    if episodes is not None and not (_integer(episodes) and episodes >= 1):
        j.add(
            ("evaluation", "episodes"),
            f"evaluation.episodes: {_shown(episodes)}, not a whole number >= 1",
            "write how many episodes to evaluate, e.g. 20",
        )
    if video is not None and not (_integer(video) and video >= 0):
        j.add(
            ("evaluation", "video"),
            f"evaluation.video: {_shown(video)}, not a whole number >= 0",
            "write how many episodes to record, e.g. 2 (0: none)",
        )
    elif isinstance(video, int) and isinstance(episodes, int) and video > episodes:
        j.add(
            ("evaluation", "video"),
            f"evaluation.video: {video} recorded episodes of {episodes} evaluated",
            f"record at most {episodes}",
        )


def _sweep(j: _Judge, algorithm: Algorithm | None) -> None:
    exp = j.exp
    n = exp.num_samples
    if not (_integer(n) and n >= 1):
        j.add(
            ("num_samples",),
            f"num_samples: {_shown(n)}, not a whole number >= 1",
            "write how many samples of the random spaces to run, e.g. 4",
        )
    elif n > 1 and not any(
        (s := space_of(v)) is not None and s[0] in RANDOM
        for v in (exp.config.values() if isinstance(exp.config, dict) else ())
    ):
        j.add(
            ("num_samples",),
            f"num_samples: {n} with no random space in config (each sample would repeat the "
            "same trials)",
            "add a choice/uniform/loguniform/randint to config, or more seeds instead",
        )
    if exp.metric is not None and not (isinstance(exp.metric, str) and exp.metric):
        j.add(("metric",), f"metric: {_shown(exp.metric)}, not a metric's name", "write e.g. "
              "`metric: env_runners/episode_return_mean`")  # fmt: skip
    if exp.mode is not None and exp.mode not in MODES:
        j.add(("mode",), f"mode: {_shown(exp.mode)}", "write `mode: max` or `mode: min`")
    sched = exp.scheduler
    if sched is None:
        return
    if not isinstance(sched, dict) or "type" not in sched:
        j.add(
            ("scheduler",),
            f"scheduler: {_shown(sched)}, not a mapping with a type",
            f"write e.g. `scheduler: {{type: asha, max_t: 50}}` (types: {', '.join(SCHEDULERS)})",
        )
        return
    kind = str(sched["type"]).lower()
    if kind not in SCHEDULERS:
        j.add(
            ("scheduler", "type"),
            f"scheduler type `{sched['type']}` is not one provisioner runs",
            _did_you_mean(kind, SCHEDULERS, f"the types: {', '.join(SCHEDULERS)}"),
        )
        return
    allowed = SCHEDULERS[kind]
    for key, value in sched.items():
        if key == "type":
            continue
        if key not in allowed:
            j.add(
                ("scheduler", key),
                f"unknown key `scheduler.{key}` for {kind}",
                _did_you_mean(key, allowed, f"{kind} takes: {', '.join(allowed)}"),
            )
        elif key in ("max_t", "grace_period", "perturbation_interval") and not (
            _integer(value) and value >= 1
        ):
            j.add(("scheduler", key), f"scheduler.{key}: {_shown(value)}", "a whole number >= 1")
    if kind == "pbt":
        mutations = sched.get("hyperparam_mutations")
        if not isinstance(mutations, dict) or not mutations:
            j.add(
                ("scheduler",),
                "pbt needs hyperparam_mutations: the config keys it perturbs",
                "write e.g. `hyperparam_mutations: {lr: {uniform: [1.0e-5, 1.0e-3]}}`",
            )
        elif algorithm is not None:
            for key, value in mutations.items():
                if key not in algorithm.keys:
                    j.add(
                        ("scheduler", "hyperparam_mutations", key),
                        f"pbt mutates `{key}`, which is no config key of {algorithm.name}",
                        _did_you_mean(key, algorithm.keys, "name a config key"),
                    )
                space = space_of(value)
                if not (isinstance(value, list) and value) and not (
                    space is not None and space_problem(*space) is None
                ):
                    j.add(
                        ("scheduler", "hyperparam_mutations", key),
                        f"pbt's values for `{key}`: {_shown(value)}",
                        "a list of values, or a space such as {uniform: [low, high]}",
                    )
        if not exp.checkpoint_frequency:
            j.add(
                ("scheduler",),
                "pbt copies the best trials' checkpoints into the others: the file makes none",
                "add checkpoint_frequency (at most the perturbation_interval)",
            )


def _resources(j: _Judge) -> None:
    res = _mapping(j, "resources", j.exp.resources, tuple(RESOURCE_KEYS))
    if res is None:
        return
    for key, integer, least in (
        ("env_runners", True, 0),
        ("learners", True, 0),
        ("cpus_per_env_runner", False, 0),
        ("gpus_per_learner", False, 0),
    ):
        if key not in res:
            continue
        value = res[key]
        ok = (_integer(value) if integer else _number(value)) and value >= least
        if key == "cpus_per_env_runner" and ok and value == 0:
            ok = False
        if not ok:
            kind = (
                "a whole number >= 0"
                if integer
                else ("a number > 0" if key == "cpus_per_env_runner" else "a number >= 0")
            )
            j.add(
                ("resources", key), f"resources.{key}: {_shown(value)}, not {kind}", f"write {kind}"
            )


def _fits(j: _Judge, exp: Experiment, facts: Facts, cluster: ClusterCapacity) -> None:
    config = resolved_config(exp, facts)
    wanted = bundles(config)
    per_runner = float(config["num_cpus_per_env_runner"])
    runners = int(config["num_env_runners"])
    others = sum(b.cpus for b in wanted if b.what != "env runner")
    cpus = sum(b.cpus for b in wanted)
    runners_at = (
        ("resources", "env_runners")
        if isinstance(exp.resources, dict) and ("env_runners" in exp.resources)
        else ("config", "num_env_runners")
    )
    if cpus > cluster.cpus:
        fit = int(max(0.0, cluster.cpus - others) // per_runner)
        groups: dict[str, list[float]] = {}
        for b in wanted:
            groups.setdefault(b.what, []).append(b.cpus)
        parts = ", ".join(
            f"{sum(c):g} for the {w}"
            if w == "main process"
            else f"{sum(c):g} for {len(c)} {w}{'s' if len(c) > 1 else ''} of {c[0]:g}"
            for w, c in groups.items()
        )
        j.add(
            runners_at,
            f"the run needs {cpus:g} CPUs ({parts}); the cluster has {cluster.cpus:g} "
            f"on {len(cluster.nodes)} node(s)",
            f"at most {fit} env runner{'' if fit == 1 else 's'} of {per_runner:g} "
            f"CPU{'' if per_runner == 1 else 's'} fit: lower "
            "resources.env_runners or cpus_per_env_runner, or add nodes",
        )
    biggest = max((n.cpus for n in cluster.nodes), default=0.0)
    if per_runner > biggest and runners:
        j.add(
            ("resources", "cpus_per_env_runner")
            if isinstance(exp.resources, dict) and "cpus_per_env_runner" in exp.resources
            else ("config", "num_cpus_per_env_runner"),
            f"an env runner of {per_runner:g} CPUs fits on no node (the largest has {biggest:g})",
            f"at most {biggest:g} CPUs per env runner",
        )
    gpus = sum(b.gpus for b in wanted)
    gpu_at = (
        ("resources", "gpus_per_learner")
        if isinstance(exp.resources, dict) and ("gpus_per_learner" in exp.resources)
        else ("config", "num_gpus_per_learner")
    )
    if gpus and not cluster.gpus:
        j.add(
            gpu_at,
            f"{gpus:g} GPU(s) asked for (gpus_per_learner "
            f"{float(config['num_gpus_per_learner']):g}); the cluster has no GPU",
            "set gpus_per_learner to 0 (learn on CPUs), or add a node with a GPU",
        )
    elif gpus > cluster.gpus:
        j.add(
            gpu_at,
            f"{gpus:g} GPUs asked for; the cluster has {cluster.gpus:g}",
            "lower resources.learners or gpus_per_learner, or add GPUs",
        )


def validate(
    exp: Experiment, facts: Facts, cluster: ClusterCapacity | None = None
) -> list[Problem]:
    """Every problem of `exp` against the image's `facts` (and, given, the cluster's
    capacity), in the file's order. The cluster is judged only when nothing else is wrong
    (the numbers it adds up are then sound)."""
    j = _Judge(exp)
    _top(j)
    algorithm = _algorithm(j, facts)
    _env(j, facts)
    if exp.stop is not None and not (
        isinstance(exp.stop, dict) and exp.stop and all(_number(v) for v in exp.stop.values())
    ):
        j.add(
            ("stop",),
            f"stop: {_shown(exp.stop)}, not a mapping of metric: number",
            "write e.g. `stop: {training_iteration: 100}`",
        )
    _config(j, algorithm, facts)
    _seeds(j)
    _checkpoint_frequency(j)
    _evaluation(j)
    _resources(j)
    _sweep(j, algorithm)
    if cluster is not None and algorithm is not None and not j.problems:
        _fits(j, exp, facts, cluster)
    return sorted(j.problems, key=lambda p: p.line)


def raise_problems(problems: list[Problem]) -> None:
    """InputError (exit 2) naming every problem, the first's place as `where`."""
    if not problems:
        return
    first = problems[0]
    if len(problems) == 1:
        raise InputError(first.message, first.fix, where=first.where)
    listed = "\n".join(f"  {p.where}: {p.message} ({p.fix})" for p in problems)
    raise InputError(
        f"{len(problems)} problems in the experiment file:\n{listed}",
        "fix each line listed",
        where=first.where,
    )


def check(exp: Experiment, facts: Facts, cluster: ClusterCapacity | None = None) -> None:
    """`validate`, raising InputError when anything is wrong."""
    raise_problems(validate(exp, facts, cluster))
