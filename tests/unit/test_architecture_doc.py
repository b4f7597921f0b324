"""docs/architecture.md names only modules that exist: each `provisioner/...` path, each
dotted `provisioner.a.b` name, each `a/b.py` file and each package-relative dotted name in
backticks (`jobs.control`, `runtime.docker.push.push_image`) must be a module of the tree,
or a name defined at the top of one. A module renamed or removed fails here until the doc
says so. Read from the files' syntax: nothing is imported."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "provisioner"
DOC = ROOT / "docs" / "architecture.md"
SOURCE_DIRS = ("provisioner", "scripts", "tests", "playbooks")


@cache
def _top_names(path: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level (and in `if` blocks there)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body += [*node.body, *node.orelse]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _module_file(parts: list[str], root: Path) -> Path | None:
    base = root.joinpath(*parts)
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def dotted_exists(name: str, root: Path = ROOT) -> bool:
    """`provisioner.a.b[.attr]`: the longest module prefix exists and the next part, if
    any, is defined at its top (a class, a function, a constant, an import)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        found = _module_file(parts[:i], root)
        if found is not None:
            return i == len(parts) or parts[i] in _top_names(found)
    return False


def path_exists(ref: str, root: Path = ROOT) -> bool:
    """`provisioner/a/b.py`, `provisioner/a/`, `a/b.py` (under provisioner/ or the repo),
    or a file's name with its last folders (`docker/facts.sh`) anywhere in the sources."""
    ref = ref.rstrip("/")
    for base in (root, root / "provisioner"):
        if (base / ref).exists() or (base / f"{ref}.py").exists():
            return True
    if "." not in Path(ref).name:
        return False
    return any(
        str(p).endswith("/" + ref) for d in SOURCE_DIRS for p in (root / d).rglob(Path(ref).name)
    )


@cache
def _strings() -> frozenset[str]:
    """Every string constant of the package: dotted names that are the code's data (a
    doctor check `gpu.cuda`, the label `provisioner.gpus`), not modules."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return frozenset(found)


FILE_TYPES = ("py", "sh", "yaml", "yml", "json", "conf", "toml", "csv", "txt", "log", "md")


def packages(root: Path = ROOT) -> frozenset[str]:
    return frozenset(p.parent.name for p in (root / "provisioner").glob("*/__init__.py"))


def missing(text: str, root: Path = ROOT) -> list[str]:
    """What `text` names that the tree lacks."""
    gone: list[str] = []
    # provisioner/... paths, not a node's (~/.provisioner/..., /run/provisioner/...)
    for ref in sorted(set(re.findall(r"(?<![\w./~-])provisioner/[\w/.-]*[\w/]", text))):
        if not path_exists(ref, root):
            gone.append(ref)
    data = _strings()
    for ref in sorted(set(re.findall(r"(?<![\w./-])provisioner(?:\.\w+)+", text))):
        if ref not in data and not dotted_exists(ref, root):
            gone.append(ref)
    spans = re.findall(r"`([^`\n]+)`", text)
    for span in spans:
        for ref in re.findall(r"(?<![\w./~-])((?:[\w-]+/)*[\w-]+\.(?:py|sh))\b", span):
            if not ref.startswith("provisioner/") and not path_exists(ref, root):
                gone.append(ref)
    tops = packages(root)
    for span in spans:
        m = re.fullmatch(r"([a-z_]+(?:\.[a-z_]\w*)+)(?:\(.*)?", span.strip())
        if not m or m.group(1).split(".")[0] not in tops or m.group(1) in data:
            continue
        if m.group(1).rpartition(".")[2] in FILE_TYPES:
            continue  # a file's name (inventory.yaml), not a module
        if not dotted_exists(f"provisioner.{m.group(1)}", root):
            gone.append(m.group(1))
    return gone


def test_every_module_the_architecture_doc_names_exists() -> None:
    gone = missing(DOC.read_text())
    assert not gone, "docs/architecture.md names what is not there:\n  " + "\n  ".join(gone)


def test_the_doc_check_catches_a_module_that_is_gone() -> None:
    """Positive control: each form of a made-up name is caught, each real one passes."""
    made_up = (
        "`provisioner/cluster/vanished.py`, provisioner/nowhere/, `provisioner.cluster.vanished`, "
        "`cluster/vanished.py`, `jobs.vanished`, `runtime.docker.push.no_such_function`"
    )
    assert sorted(missing(made_up)) == sorted(
        [
            "provisioner/cluster/vanished.py",
            "provisioner/nowhere/",
            "provisioner.cluster.vanished",
            "cluster/vanished.py",
            "jobs.vanished",
            "runtime.docker.push.no_such_function",
        ]
    )
    real = (
        "`provisioner/cluster/up.py`, provisioner/jobs/, `provisioner.cluster.up.up_cluster`, "
        "`cluster/up.py`, `docker/facts.sh`, `jobs.control`, `runtime.docker.push.push_image`, "
        "`~/.provisioner/clusters/C/ray`, the `provisioner.gpus` label"
    )
    assert missing(real) == []
