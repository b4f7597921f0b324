"""Fuzzing the inventory loaders: every malformed input is an InventoryError, never a crash."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.errors import InventoryError
from provisioner.inventory import load_inventory
from tests.cli import cli

KEYS = [
    "cluster",
    "ssh",
    "user",
    "key",
    "port",
    "known_hosts",
    "host_key_policy",
    "jump",
    "connect_timeout",
    "head",
    "workers",
    "name",
    "address",
    "resources",
    "labels",
    "image",
    "lock",
    "ray",
    "ports",
    "gcs",
    "shm_size",
    "object_store_memory",
    "all",
    "children",
    "hosts",
    "vars",
    "ansible_host",
    "ansible_user",
    "ansible_port",
]
HOSTILE = [
    "; touch /tmp/pwned",
    "$(touch /tmp/pwned)",
    "`id`",
    "-oProxyCommand=id",
    "a\nb",
    "x" * 5000,
    "",
    " ",
    "\x00",
    "..",
    "10.0.0.1; rm -rf /",
    "--help",
    "*",
    "{{x}}",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(HOSTILE),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), children, max_size=5
        ),
    ),
    max_leaves=25,
)
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _load(text: str, suffix: str = ".yaml") -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"inventory{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_inventory(path, ssh_config=Path(d) / "no-ssh-config")
        except InventoryError as exc:
            assert str(exc).strip() and exc.exit_code == 2


@FUZZ
@given(st.text(max_size=400))
def test_arbitrary_text_is_accepted_or_an_inventory_error(text: str) -> None:
    _load(text)


# Each INI example runs ansible-core in a child process (about a second): fewer examples.
@settings(max_examples=20, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_ini_is_accepted_or_an_inventory_error(text: str) -> None:
    _load("[head]\n" + text, ".ini")


@FUZZ
@given(documents)
def test_arbitrary_yaml_structures_are_accepted_or_an_inventory_error(doc: Any) -> None:
    _load(yaml.safe_dump(doc))


VALID: dict[str, Any] = {
    "cluster": "demo",
    "ssh": {"user": "lab", "port": 22, "host_key_policy": "strict"},
    "head": {"name": "n0", "address": "10.250.0.10"},
    "workers": [{"name": "n1", "address": "10.250.0.11"}, "10.250.0.12"],
}
PATHS = [
    ("cluster",),
    ("ssh", "user"),
    ("ssh", "port"),
    ("ssh", "host_key_policy"),
    ("ssh", "jump"),
    ("head", "name"),
    ("head", "address"),
    ("workers",),
    ("workers", 0, "address"),
    ("workers", 0, "name"),
    ("workers", 1),
]


@FUZZ
@given(st.sampled_from(PATHS), st.one_of(scalars, documents))
def test_one_corrupted_field_is_accepted_or_an_inventory_error(
    path: tuple[Any, ...], value: Any
) -> None:
    doc = yaml.safe_load(yaml.safe_dump(VALID))
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    _load(yaml.safe_dump(doc))


def test_hostile_values_are_rejected_with_exit_2(tmp_path: Path) -> None:
    for bad in ("; touch /tmp/pwned", "$(id)", "-oProxyCommand=id", "a\nb"):
        for field in ("address", "name"):
            doc = yaml.safe_load(yaml.safe_dump(VALID))
            doc["head"][field] = bad
            path = tmp_path / "inv.yaml"
            path.write_text(yaml.safe_dump(doc))
            r = cli("render", "-i", str(path))
            assert r.exit_code == 2, (field, bad, r.stdout, r.stderr)
            assert "Traceback" not in r.stderr and "error" in r.stderr
