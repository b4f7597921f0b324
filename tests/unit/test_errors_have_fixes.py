"""Every error the tool raises says what to do: each construction of a ProvisionerError
subclass (errors.py, and the subclasses other modules define) passes a `fix`, by keyword or
in the fix's position of the class's `__init__` (RemoteError's is third: host, message,
fix). A class whose `__init__` takes no `fix` writes its own (preflight's DoctorStopped).
Read from the code's syntax: no module is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "provisioner"
BASE = "ProvisionerError"


@dataclass(frozen=True)
class ErrorClass:
    bases: tuple[str, ...]
    params: tuple[str, ...] | None  # its own __init__'s positional parameters (no self)
    kwonly: tuple[str, ...] = ()


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _classes(trees: Iterable[ast.Module]) -> dict[str, ErrorClass]:
    found: dict[str, ErrorClass] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            init = next(
                (f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None,
            )
            params = kwonly = None
            if init is not None:
                params = tuple(a.arg for a in [*init.args.posonlyargs, *init.args.args][1:])
                kwonly = tuple(a.arg for a in init.args.kwonlyargs)
            bases = tuple(b for b in (_name(x) for x in node.bases) if b)
            found[node.name] = ErrorClass(bases, params, kwonly or ())
    return found


def _is_error(
    name: str, classes: dict[str, ErrorClass], seen: frozenset[str] = frozenset()
) -> bool:
    if name == BASE:
        return True
    cls = classes.get(name)
    if cls is None or name in seen:
        return False
    return any(_is_error(b, classes, seen | {name}) for b in cls.bases)


def _init_of(name: str, classes: dict[str, ErrorClass]) -> ErrorClass | None:
    """The nearest class up the chain that defines __init__."""
    cls = classes.get(name)
    while cls is not None:
        if cls.params is not None:
            return cls
        cls = next((classes[b] for b in cls.bases if b in classes), None)
    return None


def _empty(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (None, "")


def _has_fix(call: ast.Call, init: ErrorClass) -> bool:
    assert init.params is not None
    if "fix" not in init.params and "fix" not in init.kwonly:
        return True  # the class writes its own fix
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return True  # *args / **kwargs: cannot tell; trusted
    for k in call.keywords:
        if k.arg == "fix":
            return not _empty(k.value)
    if "fix" in init.params:
        i = init.params.index("fix")
        return len(call.args) > i and not _empty(call.args[i])
    return False


def errors_without_fix(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """`path:line: Class(...)` for each construction of a ProvisionerError subclass with no fix."""
    parsed = {p: ast.parse(p.read_text(), filename=str(p)) for p in files}
    classes = _classes(parsed.values())
    classes.setdefault(BASE, ErrorClass((), ("message", "fix"), ("where",)))
    out = []
    for path, tree in sorted(parsed.items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            if name is None or not _is_error(name, classes):
                continue
            init = _init_of(name, classes)
            if init is not None and not _has_fix(node, init):
                out.append(f"{path.relative_to(root)}:{node.lineno}: {name}(...)")
    return out


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_error_the_tool_raises_carries_a_fix() -> None:
    missing = errors_without_fix(package_files())
    assert not missing, f"{len(missing)} error(s) without a fix:\n  " + "\n  ".join(missing)


def test_the_scan_catches_an_error_without_a_fix(tmp_path: Path) -> None:
    """Positive control: each form of a missing fix is caught, each form of a given one
    passes, against the real errors.py's classes."""
    code = tmp_path / "planted.py"
    code.write_text(
        "from provisioner.errors import InputError, LabError, RemoteError, ProvisionerError\n"
        "class Mine(LabError):\n"
        "    pass\n"
        "def f(h):\n"
        "    raise InputError('no fix')\n"  # 5
        "    raise RemoteError(h, 'no fix')\n"  # 6
        "    raise Mine('no fix', where='x')\n"  # 7
        "    raise LabError('no fix', None)\n"  # 8
        "    raise InputError('m', fix='')\n"  # 9
        "    raise InputError('m', 'do this')\n"
        "    raise RemoteError(h, 'm', 'do this', kind='k')\n"
        "    raise Mine('m', fix='do this')\n"
        "    raise ProvisionerError('m', 'do this', where='w')\n"
        "    raise ValueError('not ours')\n"
    )
    found = errors_without_fix([PACKAGE / "errors.py", code], root=tmp_path.parent.parent)
    lines = sorted(int(f.split(":")[1]) for f in found if "planted.py" in f)
    assert lines == [5, 6, 7, 8, 9], found
