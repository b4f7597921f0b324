"""What validating an experiment file needs to know of the image, as plain data.

`capture_facts.py` gathers it with the image's own Python (RLlib's registry and default
configs, RLlib's deprecations, gymnasium's registry) and prints one JSON document; `Facts`
reads that document. Nothing here imports RLlib or gymnasium.

Recapture the golden copy the unit tests use (same Ray and gymnasium as the image's lock):

    .venv/bin/python - < provisioner/experiment/capture_facts.py \\
        > tests/unit/golden/experiment/facts.json
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from provisioner.errors import InputError

SCHEMA = 1
MODEL_CONFIG = "model_config"  # the new stack's model settings (`rl_module(model_config=)`)

# Old keys RLlib 2.60 still recognises (it keeps them at DEPRECATED_VALUE) but names no
# successor for. Each entry is applied only where RLlib's own capture gives no new-stack
# spelling and the spelling is a key of that algorithm. The source of each:
# - sgd_minibatch_size: `ppo.py` keeps `self.sgd_minibatch_size = DEPRECATED_VALUE`;
#   `algorithm_config.py` says `num_epochs` and `minibatch_size` were "adopted from the
#   original PPO batch settings: num_sgd_iter, minibatch_size" (the capture maps
#   `num_sgd_iter` -> `num_epochs` from RLlib's own deprecation warning).
SPELLINGS_RLLIB_NO_LONGER_NAMES: Mapping[str, str] = {"sgd_minibatch_size": "minibatch_size"}


def capture_source() -> bytes:
    """The capture script, to run with the image's Python (`python -` on stdin)."""
    return resources.files("provisioner.experiment").joinpath("capture_facts.py").read_bytes()


def runner_source() -> bytes:
    """The experiment's runner (runner.py), the driver of an experiment's job: it runs with
    the cluster's Python, put into the job's working_dir (`jobs.spec.JobSpec.runner`)."""
    return resources.files("provisioner.experiment").joinpath("runner.py").read_bytes()


@dataclass(frozen=True)
class OldKey:
    """A key of RLlib's old API stack: its new-stack spellings (none: remove it) and what
    RLlib's source says of it."""

    new: tuple[str, ...]
    rllib: tuple[str, ...]


@dataclass(frozen=True)
class Algorithm:
    name: str
    config_class: str
    defaults: Mapping[str, Any]  # key -> its JSON-able default (AlgorithmConfig.to_dict())
    old_keys: Mapping[str, OldKey]
    # a settable property -> the key of `defaults` it stores into
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        """Every flat key the algorithm's config takes (`update_from_dict`; `model_config`
        through `rl_module()`, RLlib's read-only property over `_model_config`)."""
        if f"_{MODEL_CONFIG}" not in self.defaults:
            return sorted({*self.defaults, *self.properties})
        # the new stack: `model` (the old stack's ModelV2 settings) is read by nothing
        return sorted({*self.defaults, *self.properties, MODEL_CONFIG} - {"model"})

    def stored_as(self, key: str) -> str:
        """The `to_dict()` key a flat key ends up in."""
        if key == MODEL_CONFIG and f"_{MODEL_CONFIG}" in self.defaults:
            return f"_{MODEL_CONFIG}"
        return self.properties.get(key, key)


@dataclass(frozen=True)
class Env:
    env_id: str
    entry_point: str
    error: str | None  # why its entry point does not import in the image (None: it does)


@dataclass(frozen=True)
class Facts:
    versions: Mapping[str, str]
    algorithms: Mapping[str, Algorithm]
    envs: Mapping[str, Env] = field(default_factory=dict)
    # DefaultModelConfig's fields: what `config.model_config` takes (empty: facts captured
    # before they were kept; its keys are then left to RLlib)
    model_config_keys: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Facts:
        if data.get("schema") != SCHEMA:
            raise InputError(
                f"facts of schema {data.get('schema')!r}, this provisioner reads {SCHEMA}",
                "capture the facts again with this provisioner's capture_facts.py",
            )
        algorithms = {}
        for name, a in data["algorithms"].items():
            defaults = dict(a["defaults"])
            old = {}
            for key, o in a["old_keys"].items():
                new = tuple(o["new"])
                added = SPELLINGS_RLLIB_NO_LONGER_NAMES.get(key)
                if not new and added in defaults:
                    new = (added,)
                old[key] = OldKey(new=new, rllib=tuple(o["rllib"]))
            properties = {str(k): str(v) for k, v in a.get("properties", {}).items()}
            algorithms[name] = Algorithm(name, str(a["config_class"]), defaults, old, properties)
        envs = {
            env_id: Env(env_id, str(e["entry_point"]), e.get("error"))
            for env_id, e in data["envs"].items()
        }
        model = tuple(str(k) for k in data.get("model_config_keys", ()))
        return cls(dict(data["versions"]), algorithms, envs, model)


def load_facts(path: Path) -> Facts:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"cannot read the image's experiment facts: {exc}",
            "capture them again (provisioner/experiment/capture_facts.py, the image's Python)",
            where=str(path),
        ) from None
    return Facts.from_json(data)
