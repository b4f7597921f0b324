"""An experiment file: YAML in the shape of RLlib's tuned examples, read with each key's line.

    cartpole-ppo:                 # the experiment's name (one per file)
      env: CartPole-v1            # a registered gymnasium id
      run: PPO                    # the algorithm (RLlib's registry)
      stop: {env_runners/episode_return_mean: 450, training_iteration: 200}
      config:                     # flat keys of the algorithm's AlgorithmConfig (new stack)
        lr: 0.0003
        num_epochs: 6
      # what a cluster run adds:
      seeds: [0, 1, 2]            # one run per seed (default [0])
      checkpoint_frequency: 10    # a checkpoint every N iterations
      evaluation: {episodes: 20, video: 2}
      resources: {env_runners: 4, cpus_per_env_runner: 1, learners: 1, gpus_per_learner: 0}
      # a sweep (`experiment.search`): Tune's search spaces in `config`, and
      num_samples: 4              # samples of its random spaces (default 1)
      scheduler: {type: asha, max_t: 50, grace_period: 5}
      metric: env_runners/episode_return_mean   # the best trial's (default), and
      mode: max

`load_experiment` refuses only what makes the file no experiment at all (not YAML, not one
name mapping to keys); every other mistake is found by `validate` with its file and line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import InputError

# The keys under the experiment's name: RLlib's own, then what a cluster run adds.
RLLIB_KEYS = ("env", "run", "stop", "config")
EXTRA_KEYS = ("seeds", "checkpoint_frequency", "evaluation", "resources")
SWEEP_KEYS = ("num_samples", "scheduler", "metric", "mode")
TOP_KEYS = RLLIB_KEYS + EXTRA_KEYS + SWEEP_KEYS
DEFAULT_SEEDS = (0,)

Path_ = tuple[str, ...]  # a key's place: ("config", "lr")


class _Loader(yaml.SafeLoader):
    """PyYAML reads YAML 1.1, where `3e-4` is text; YAML 1.2 (and every researcher) means
    the number. Everything else is SafeLoader's."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass(frozen=True)
class Experiment:
    """One experiment as written. The extras keep what the file says (typed by `validate`);
    `lines` gives each key's line, the name's line under ()."""

    path: Path
    name: str
    env: Any = None
    run: Any = None
    stop: Any = None
    config: Any = field(default_factory=dict)
    seeds: Any = DEFAULT_SEEDS
    checkpoint_frequency: Any = None
    evaluation: Any = None
    resources: Any = None
    num_samples: Any = 1
    scheduler: Any = None
    metric: Any = None
    mode: Any = None
    written: frozenset[str] = frozenset()  # the keys the file has under the name
    unknown: Mapping[str, Any] = field(default_factory=dict)  # keys not in TOP_KEYS
    lines: Mapping[Path_, int] = field(default_factory=dict)

    def line(self, *keys: str) -> int:
        """The line of the deepest of `keys` the file has (the name's line if none)."""
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.lines:
                return self.lines[keys[:n]]
        return self.lines.get((), 1)

    def where(self, *keys: str) -> str:
        return f"{self.path}:{self.line(*keys)}"


MAX_DEPTH = 64


def _read(loader: _Loader, node: yaml.Node, at: Path_, lines: dict[Path_, int]) -> Any:
    if len(at) > MAX_DEPTH:
        raise InputError(
            f"nested more than {MAX_DEPTH} levels deep (an anchor that holds itself?)",
            "write the values out instead of through that anchor",
            where=f"{loader.name}:{node.start_mark.line + 1}",
        )
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # `<<: *anchor` merges
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str | int | float | bool):
                raise InputError(
                    f"{'.'.join(at) or 'the file'}: a key must be a name, not {key!r}",
                    "write `name: value` (quote a key that looks like a list or a mapping)",
                    where=f"{loader.name}:{line}",
                )
            name = str(key)
            if (*at, name) in lines:
                raise InputError(
                    f"{'.'.join((*at, name))} appears twice (first on line {lines[(*at, name)]})",
                    "remove one of them",
                    where=f"{loader.name}:{line}",
                )
            lines[(*at, name)] = line
            result[name] = _read(loader, value_node, (*at, name), lines)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*at, str(i))] = item.start_mark.line + 1
            items.append(_read(loader, item, (*at, str(i)), lines))
        return items
    return loader.construct_object(node, deep=True)


def _parse(path: Path, text: str) -> tuple[Any, dict[Path_, int]]:
    lines: dict[Path_, int] = {}
    loader = _Loader(text)
    loader.name = str(path)
    try:
        node = loader.get_single_node()
        data = None if node is None else _read(loader, node, (), lines)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputError(
            f"not valid YAML: {exc.problem or exc}",
            "fix the YAML syntax on that line (indentation, a missing ':' or quote)",
            where=f"{path}:{mark.line + 1 if mark else 1}",
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {exc}", "fix the YAML syntax", where=str(path)) from None
    finally:
        loader.dispose()
    return data, lines


def parse_experiment(path: Path, text: str) -> Experiment:
    """The experiment `text` (the content of `path`) describes."""
    data, lines = _parse(path, text)
    shape = (
        "the file is one experiment: its name, then env, run, stop and config under it "
        "(the shape of RLlib's tuned examples)"
    )
    if not isinstance(data, dict) or not data:
        raise InputError(
            "not an experiment (no `NAME:` mapping at the top)", shape, where=f"{path}:1"
        )
    if len(data) > 1:
        names = list(data)
        raise InputError(
            f"{len(names)} experiments in one file ({', '.join(names)}); provisioner runs one "
            "per file",
            f"keep one (`{names[0]}`) and put the others in files of their own",
            where=f"{path}:{lines[(names[1],)]}",
        )
    ((name, body),) = data.items()
    if not isinstance(body, dict):
        raise InputError(
            f"`{name}:` holds {type(body).__name__}, not the experiment's keys",
            shape,
            where=f"{path}:{lines[(name,)]}",
        )
    # lines relative to the experiment: ("config", "lr"), and () for its name
    own = {at[1:]: line for at, line in lines.items() if at[:1] == (name,)}
    known = {k: v for k, v in body.items() if k in TOP_KEYS}
    return Experiment(
        path=path,
        name=name,
        env=known.get("env"),
        run=known.get("run"),
        stop=known.get("stop"),
        config=known.get("config", {}),
        seeds=known.get("seeds", list(DEFAULT_SEEDS)),
        checkpoint_frequency=known.get("checkpoint_frequency"),
        evaluation=known.get("evaluation"),
        resources=known.get("resources"),
        num_samples=known.get("num_samples", 1),
        scheduler=known.get("scheduler"),
        metric=known.get("metric"),
        mode=known.get("mode"),
        written=frozenset(known),
        unknown={k: v for k, v in body.items() if k not in TOP_KEYS},
        lines=own,
    )


def load_experiment(path: Path) -> Experiment:
    """Read an experiment file (InputError, exit 2, when it is no experiment at all)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read the experiment file: {exc.strerror if isinstance(exc, OSError) else exc}",
            "give the path of a readable YAML file",
            where=str(path),
        ) from None
    return parse_experiment(path, text)
