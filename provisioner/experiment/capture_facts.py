"""Runs with the IMAGE's Python (`python - < capture_facts.py`); not imported locally.

Prints one JSON document on stdout: what validating an experiment file needs to know of the
image's RLlib and gymnasium (`provisioner.experiment.facts.Facts` reads it). Everything else
the libraries print goes to stderr.

- `algorithms`: each algorithm of RLlib's registry (`ray.rllib.algorithms.registry.ALGORITHMS`)
  -> `config_class`, `defaults` (its default `AlgorithmConfig.to_dict()`, made JSON-able:
  a class or function as its dotted name, any other object as `<module.Type>`) and
  `old_keys` (old key -> the new-stack keys RLlib names for it and what RLlib says) and
  `properties` (a settable property -> the key it stores into: `train_batch_size_per_learner`
  is a flat key `update_from_dict` takes, stored as `_train_batch_size_per_learner`).
- `envs`: each registered gymnasium id -> its entry point and, when the entry point's module
  does not import here (MuJoCo not installed...), the error.
- `versions`: python, ray, gymnasium.

The old keys come from RLlib's own deprecation machinery, recorded while it runs (its
`deprecation_warning` is swapped for a recorder on a throwaway config), never from a table
of ours: the renames of `AlgorithmConfig._translate_special_keys` (`num_workers`), the
deprecated properties' setters (`num_rollout_workers`), the config methods' deprecated
arguments (`training(num_sgd_iter=..)`) and the attributes an algorithm keeps at
`DEPRECATED_VALUE` (`sgd_minibatch_size`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import json
import math
import platform
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

Record = list[tuple[str, str | None]]


def plain(value: Any, depth: int = 0) -> Any:
    """A config value as JSON: containers kept, a class or function by its dotted name,
    anything else by its type (no memory addresses: the capture is reproducible)."""
    if depth > 20:
        return "<too deep>"
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [plain(v, depth + 1) for v in items]
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value):
        return f"{value.__module__}.{value.__qualname__}"
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


@contextlib.contextmanager
def recording(config_class: type) -> Iterator[Record]:
    """RLlib's `deprecation_warning`, as each module of the config class's lineage names
    it, swapped for a recorder of (old, new)."""
    calls: Record = []

    def record(old: str, new: str | None = None, **_: Any) -> None:
        calls.append((str(old), None if new is None else str(new)))

    modules: set[Any] = {sys.modules[c.__module__] for c in config_class.__mro__}
    saved = {m: m.deprecation_warning for m in modules if hasattr(m, "deprecation_warning")}
    for module in saved:
        module.deprecation_warning = record
    try:
        yield calls
    finally:
        for module, original in saved.items():
            module.deprecation_warning = original


def quietly(call: Callable[[], Any]) -> None:
    with contextlib.suppress(Exception):
        call()


def special_keys(base: Any) -> list[str]:
    """The keys `_translate_special_keys` compares against (read from its source)."""
    source = textwrap.dedent(inspect.getsource(base._translate_special_keys))
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    found.append(side.value)
    return sorted(set(found))


def new_keys(text: str | None, valid: set[str]) -> list[str]:
    """The valid keys RLlib's `new` text names: `config.training(num_epochs=..)` ->
    ["num_epochs"]; `AlgorithmConfig.num_env_runners` -> ["num_env_runners"]."""
    if not text:
        return []
    words = re.findall(r"[A-Za-z_]\w*", text)
    return list(dict.fromkeys(w for w in words if w in valid))


def old_keys(config: Any, defaults: dict[str, Any], deprecated: Any) -> dict[str, Any]:
    config_class = type(config)
    base: Any = next(c for c in config_class.__mro__ if c.__name__ == "AlgorithmConfig")
    valid = {k for k, v in defaults.items() if v is not deprecated}
    found: dict[str, Any] = {}

    def add(old: str, new: str | None, how: str, rllib: str) -> None:
        if old in valid or old.startswith("_"):
            return
        entry = found.setdefault(old, {"new": [], "rllib": []})
        for key in new_keys(new, valid):
            if key not in entry["new"]:
                entry["new"].append(key)
        said = f"{how}: {rllib}"
        if said not in entry["rllib"]:
            entry["rllib"].append(said)

    # 1. the renames `update_from_dict` applies (`num_workers` -> `num_env_runners`)
    for key in special_keys(base):
        with recording(config_class) as calls:
            try:
                to = base._translate_special_keys(key, warn_deprecated=True)
            except Exception:
                to = key
        for old, new in calls:
            add(key, new, "_translate_special_keys", f"{old} -> {new}")
        if not calls and to != key and key not in valid and to in valid:
            add(key, to, "_translate_special_keys", f"{key} -> {to}")

    # 2. the deprecated properties' setters, 3. the config methods' deprecated arguments
    for klass in config_class.__mro__:
        for name, member in vars(klass).items():
            if isinstance(member, property) and member.fset is not None:
                with recording(config_class) as calls:
                    quietly(functools.partial(member.fset, config_class(), 1))
                for old, new in calls:
                    add(name, new, f"{klass.__name__}.{name} (property)", f"{old} -> {new}")
            elif inspect.isfunction(member) and not name.startswith("_"):
                try:
                    params = inspect.signature(member).parameters.values()
                except (TypeError, ValueError):
                    continue
                for p in params:
                    if p.default is not deprecated:
                        continue
                    with recording(config_class) as calls:
                        quietly(functools.partial(getattr(config_class(), name), **{p.name: 1}))
                    for old, new in calls:
                        add(p.name, new, f"{klass.__name__}.{name}({p.name}=..)", f"{old} -> {new}")
                    if not calls:
                        add(p.name, None, f"{klass.__name__}.{name}({p.name}=..)", "deprecated")

    # 4. attributes the algorithm keeps at DEPRECATED_VALUE
    for key, value in defaults.items():
        if value is deprecated:
            add(key, None, f"{config_class.__name__}.{key}", "DEPRECATED_VALUE")
    return {k: found[k] for k in sorted(found)}


def properties(config: Any) -> dict[str, str]:
    """The config's settable properties that are no deprecation -> the `to_dict()` key each
    stores into (`train_batch_size_per_learner` -> `_train_batch_size_per_learner`): a
    flat key `update_from_dict` accepts though `to_dict` spells it otherwise."""
    config_class = type(config)
    sentinel = 987654321
    found: dict[str, str] = {}
    for klass in config_class.__mro__:
        for name, member in vars(klass).items():
            if name.startswith("_") or not isinstance(member, property) or member.fset is None:
                continue
            fresh = config_class()
            before = fresh.to_dict()
            with recording(config_class) as calls:
                quietly(functools.partial(member.fset, fresh, sentinel))
            if calls:
                continue
            after = fresh.to_dict()
            stored = [k for k, v in after.items() if v == sentinel and before.get(k) != sentinel]
            if len(stored) == 1:
                found[name] = stored[0]
    return dict(sorted(found.items()))


def algorithms() -> dict[str, Any]:
    from ray._common.deprecation import DEPRECATED_VALUE
    from ray.rllib.algorithms.registry import ALGORITHMS

    result: dict[str, Any] = {}
    for name in sorted(ALGORITHMS):
        load: Any = ALGORITHMS[name]
        _, config = load()
        defaults = config.to_dict()
        config_class = type(config)
        result[name] = {
            "config_class": f"{config_class.__module__}.{config_class.__qualname__}",
            "defaults": {
                k: plain(v) for k, v in sorted(defaults.items()) if v is not DEPRECATED_VALUE
            },
            "old_keys": old_keys(config, defaults, DEPRECATED_VALUE),
            "properties": properties(config),
        }
    return result


def model_config_keys() -> list[str]:
    """The fields of RLlib's DefaultModelConfig: the keys `model_config` takes
    (`AlgorithmConfig.rl_module(model_config=...)`)."""
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return sorted(f.name for f in dataclasses.fields(DefaultModelConfig))


def envs() -> dict[str, Any]:
    import gymnasium
    from gymnasium.envs.registration import registry

    for plugin in ("ale_py", "shimmy"):  # they register their ids when imported
        with contextlib.suppress(Exception):
            gymnasium.register_envs(importlib.import_module(plugin))
    result: dict[str, Any] = {}
    for env_id in sorted(registry):
        spec = registry[env_id]
        entry = spec.entry_point
        if callable(entry):
            result[env_id] = {"entry_point": plain(entry), "error": None}
            continue
        error = None
        try:
            importlib.import_module(str(entry).split(":")[0])
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        result[env_id] = {"entry_point": str(entry), "error": error}
    return result


def main() -> None:
    with contextlib.redirect_stdout(sys.stderr):
        import gymnasium
        import ray

        document = {
            "schema": 1,
            "versions": {
                "python": platform.python_version(),
                "ray": ray.__version__,
                "gymnasium": gymnasium.__version__,
            },
            "algorithms": algorithms(),
            "envs": envs(),
            "model_config_keys": model_config_keys(),
        }
    sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
