"""YAML that remembers where each value came from, so errors can name the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import InventoryError


class LocatedMap(dict[Any, Any]):
    """A mapping that knows its own line and the line of each key."""

    line: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LocatedList(list[Any]):
    """A sequence that knows its own line and the line of each item."""

    line: int = 0
    item_lines: list[int] = []  # noqa: RUF012 (always replaced per instance)


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedMap:
    loader.flatten_mapping(node)
    result = LocatedMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if isinstance(key, list | dict):
            raise InventoryError(
                f"a {'list' if isinstance(key, list) else 'mapping'} used as a key: {key!r}",
                "keys are names: write `name: value` (quote a key that looks like a list or map)",
                where=f"{loader.name}:{line}",
            )
        if key in result.key_lines:
            raise InventoryError(
                f"key {key!r} appears twice (first on line {result.key_lines[key]})",
                "remove one of them",
                where=f"{loader.name}:{line}",
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList(loader.construct_object(item, deep=True) for item in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [item.start_mark.line + 1 for item in node.value]
    return result


def _int(loader: _Loader, node: yaml.ScalarNode) -> int | str:
    """YAML 1.1 reads 1:30:00 as a base-60 number (5400); YAML 1.2 and every user mean the
    text (a SLURM time limit, a port mapping): keep it as written."""
    if ":" in str(node.value):
        return str(node.value)
    return int(loader.construct_yaml_int(node))


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_yaml(path: Path, text: str) -> Any:
    """Parse YAML text; syntax errors become InventoryErrors with file and line."""
    try:
        loader = _Loader(text)
        loader.name = str(path)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise InventoryError(
            f"not valid YAML: {exc.problem or exc}",
            "fix the YAML syntax on that line (indentation, a missing ':' or quote)",
            where=f"{path}:{line}",
        ) from None
    except yaml.YAMLError as exc:
        raise InventoryError(
            f"not valid YAML: {exc}", "fix the YAML syntax", where=str(path)
        ) from None
