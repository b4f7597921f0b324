"""Every e2e module has its place in tests/e2e/conftest.py's module order (the suite shares
one lab: a module left out runs last, on whatever state the others left)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e import conftest

E2E = Path(__file__).resolve().parents[1] / "e2e"


def test_every_e2e_module_is_in_the_module_order() -> None:
    stems = {p.stem for p in E2E.glob("test_*.py")}
    assert len(stems) > 20  # positive control: the glob finds the modules
    assert conftest.unordered_modules(stems) == []


def test_a_module_missing_from_the_order_is_named() -> None:
    stems = {"test_lab", "test_sagemaker_local", "test_brand_new"}
    assert conftest.unordered_modules(stems) == ["test_brand_new"]


def test_the_order_names_only_modules_that_exist() -> None:
    stems = {p.stem for p in E2E.glob("test_*.py")}
    assert set(conftest.MODULE_ORDER) - stems == set()
    assert len(conftest.MODULE_ORDER) == len(set(conftest.MODULE_ORDER))
