"""The layering: no import cycle between provisioner's packages, nothing outside the lab
imports the lab, and nothing outside provisioner/runtime/ branches on a runtime's name.

Every import counts: module level, lazy (inside a function), and under `TYPE_CHECKING`.
A `TYPE_CHECKING` import is a dependency of the code's meaning (its types) even when it
costs nothing at run time, so a cycle through one is still a cycle of the design.

Run it alone: `pytest -q tests/unit/test_layering.py`; the graph it checks is printed by
`python -m tests.unit.test_layering` (package -> the packages it imports).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "provisioner"

# Modules and packages inside `provisioner/`: `provisioner.errors` -> "errors",
# `provisioner.cluster.up` -> "cluster".
Graph = Mapping[str, Iterable[str]]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module this file imports, at any depth of its code (lazy and TYPE_CHECKING too),
    as absolute dotted names. `from A import b` gives both A and A.b (b may be a module)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def known_modules() -> set[str]:
    return {module_name(p) for p in source_files()}


def top_package(module: str) -> str | None:
    """`provisioner.cluster.up` -> "cluster"; `provisioner.errors` -> "errors"; others None."""
    parts = module.split(".")
    if parts[0] != "provisioner" or len(parts) < 2:
        return None
    return parts[1]


def package_graph() -> dict[str, set[str]]:
    """Top-level package (or module, like `errors`) -> the others it imports."""
    known = known_modules()
    graph: dict[str, set[str]] = {}
    for path in source_files():
        here = top_package(module_name(path))
        if here is None:
            continue
        graph.setdefault(here, set())
        for target in imported_modules(path):
            if target not in known:
                continue
            there = top_package(target)
            if there is not None and there != here:
                graph[here].add(there)
    return graph


def module_graph(package: str) -> dict[str, set[str]]:
    """Within one package: module -> the package's modules it imports (the package's
    own `__init__` left out: importing a sibling through it is no cycle of modules)."""
    known = known_modules()
    prefix = f"provisioner.{package}"
    graph: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        here = module_name(path)
        if here == prefix:
            continue
        graph[here] = {
            t
            for t in imported_modules(path)
            if t in known and t.startswith(prefix + ".") and t != here
        }
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one member, or a self-loop
    (Tarjan's algorithm): each is a set of nodes that all reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})

    def edges(v: str) -> list[str]:
        return sorted(graph.get(v, ()))

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges(v):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(sorted(component))

    for v in nodes:
        if v not in index:
            strongconnect(v)
    return sorted(components)


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle through each strongly connected component: ["a", "b", "a"]."""
    return [_cycle_in(graph, members) for members in strongly_connected(graph)]


def _cycle_in(graph: Graph, members: list[str]) -> list[str]:
    """One closed path through a strongly connected component, from its first member back
    to it (the shortest, breadth first): ["a", "b", "a"]."""
    inside = set(members)
    start = members[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        step: list[str] = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w in inside and w not in previous:
                    previous[w] = v
                    step.append(w)
        frontier = step
    raise AssertionError(f"no cycle through {members}")  # a component always has one


def describe(graph: Graph) -> str:
    """Each cycle, and every member of the tangle it belongs to (all must be untangled)."""
    lines = [
        f"{' -> '.join(_cycle_in(graph, members))}   (in one cycle: {', '.join(members)})"
        for members in strongly_connected(graph)
    ]
    return "import cycles:\n  " + "\n  ".join(lines)


# --- the cycle finder itself (positive controls) ----------------------------------------


def test_cycle_finder_finds_a_cycle_in_a_synthetic_graph() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    cycles = find_cycles(graph)
    assert ["a", "b", "c", "a"] in cycles
    assert ["e", "e"] in cycles
    assert len(cycles) == 2


def test_cycle_finder_passes_a_layered_graph() -> None:
    assert find_cycles({"cli": {"cluster", "errors"}, "cluster": {"errors"}, "errors": set()}) == []


def test_imports_are_read_lazy_and_under_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "provisioner" / "a"
    pkg.mkdir(parents=True)
    (tmp_path / "provisioner" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    from provisioner.b.types import T\n"
        "def f() -> None:\n"
        "    import provisioner.c.lazy\n"
        "    from ..d import thing\n"
    )
    found = imported_modules(pkg / "m.py", tmp_path)
    assert {
        "provisioner.a.sibling",
        "provisioner.b.types",
        "provisioner.c.lazy",
        "provisioner.d",
        "provisioner.d.thing",
    } <= found


# --- the code base -------------------------------------------------------------------------


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert "runtime" in graph and "cluster" in graph  # the graph was read at all
    cycles = find_cycles(graph)
    assert not cycles, describe(graph)


def test_no_import_cycle_between_the_cli_modules() -> None:
    graph = module_graph("cli")
    assert "provisioner.cli.jobs" in graph
    cycles = find_cycles(graph)
    assert not cycles, describe(graph)


def test_no_import_cycle_between_modules_of_any_package() -> None:
    for package in sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        graph = module_graph(package)
        cycles = find_cycles(graph)
        assert not cycles, f"in provisioner/{package}/: " + describe(graph)


def test_nothing_outside_the_lab_imports_the_lab() -> None:
    """provisioner/lab/ may import itself; scripts/ and tests/ may import it; the CLI's
    `lab` group is the lab's own front end (cli/lab.py)."""
    allowed = {PACKAGE / "lab", PACKAGE / "cli" / "lab.py"}
    offenders = []
    for path in source_files():
        if any(path == a or a in path.parents for a in allowed):
            continue
        hits = sorted(
            t
            for t in imported_modules(path)
            if t == "provisioner.lab" or t.startswith("provisioner.lab.")
        )
        if hits:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(hits)}")
    assert not offenders, "imports of provisioner.lab outside the lab:\n  " + "\n  ".join(offenders)


def test_the_lab_import_check_sees_a_lab_import() -> None:
    """Positive control: the reader the check relies on finds `provisioner.lab` in cli/lab.py."""
    found = imported_modules(PACKAGE / "cli" / "lab.py")
    assert any(t.startswith("provisioner.lab") for t in found)


def docker_importers() -> list[str]:
    """Modules outside Docker's folder that import from it. Podman is Docker's container
    code with its own binary (item 2 of issue 48), so it may; nothing else: what every
    runtime shares (PushOptions, the delivery report) lives in neutral modules."""
    allowed = {PACKAGE / "runtime" / "docker", PACKAGE / "runtime" / "podman"}
    return [
        str(path.relative_to(ROOT))
        for path in source_files()
        if not any(a in path.parents for a in allowed)
        and any(t.startswith("provisioner.runtime.docker") for t in imported_modules(path))
    ]


def test_nothing_but_docker_and_podman_imports_dockers_folder() -> None:
    assert not docker_importers(), docker_importers()
    # positive control: Podman's runtime does import Docker's code, and the reader sees it
    found = imported_modules(PACKAGE / "runtime" / "podman" / "runtime.py")
    assert any(t.startswith("provisioner.runtime.docker.") for t in found)


# --- no branch on a runtime's name outside provisioner/runtime/ -----------------------------
#
# The same check as a grep anyone can run: scripts/runtime_name_grep.sh (no output: no
# branch). The test below also reads the code's syntax, so that it flags only what
# compares, matches, looks up or defaults a runtime's name, and not the Docker SDK,
# `docker` as a program's name, or facts sections named "docker".

# The lab asks each runtime for its node recipe (`runtime.registry.lab_recipe`): it names
# none. The inventory's one default is data: the runtime an inventory that names none gets.
NAME_BRANCH_EXEMPT = (PACKAGE / "runtime",)
DEFAULT_AS_DATA = {("provisioner/inventory/models.py", "DEFAULT_RUNTIME")}


def _mentions_runtime(node: ast.AST) -> bool:
    return "runtime" in ast.unparse(node).lower()


def _names_in(node: ast.AST, names: frozenset[str]) -> bool:
    """The expression is a runtime's name, or a literal tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(isinstance(e, ast.Constant) and e.value in names for e in node.elts)
    return False


def name_branches(source: str, names: frozenset[str], where: str = "<src>") -> list[str]:
    """Every place in `source` that branches on, looks up or defaults a runtime's name:
    `x.runtime == "docker"`, `runtime in ("docker", "host")`, `match runtime: case "host"`,
    `{"docker": ...}` keyed only by runtime names, `runtime: str = "docker"`,
    `def f(runtime="docker")`, `f(..., runtime="docker")`, `.get("runtime", "docker")`,
    and a runtime's name passed where a runtime goes (`plans_for(..., "docker")`)."""
    tree = ast.parse(source)
    found: list[str] = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}: {ast.unparse(node)[:80]}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                others = sides[:i] + sides[i + 1 :]
                if _names_in(side, names) and any(_mentions_runtime(o) for o in others):
                    hit(node, "compares a runtime's name")
                    break
        elif isinstance(node, ast.Match) and _mentions_runtime(node.subject):
            for case in node.cases:
                if any(
                    isinstance(p, ast.MatchValue) and _names_in(p.value, names)
                    for p in ast.walk(case.pattern)
                ):
                    hit(node, "matches a runtime's name")
        elif isinstance(node, ast.Dict) and node.keys:
            keys = [k for k in node.keys if k is not None]
            if keys and all(isinstance(k, ast.Constant) and k.value in names for k in keys):
                hit(node, "a table keyed by runtime names")
        elif isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            named = _names_in(node.value, names) and any(_mentions_runtime(t) for t in targets)
            if named and (where, ast.unparse(targets[0])) not in DEFAULT_AS_DATA:
                hit(node, "a runtime's name as a default")
        elif isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            with_default = positional[len(positional) - len(node.defaults) :]
            pairs = list(zip(with_default, node.defaults, strict=True))
            keyword = zip(node.kwonlyargs, node.kw_defaults, strict=True)
            pairs += [(a, d) for a, d in keyword if d is not None]
            for arg, default in pairs:
                if "runtime" in arg.arg and _names_in(default, names):
                    hit(default, f"a runtime's name as the default of {arg.arg}")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg and "runtime" in kw.arg and _names_in(kw.value, names):
                    hit(node, "a runtime's name passed as a runtime")
            args = node.args
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and len(args) == 2
                and _mentions_runtime(args[0])
                and _names_in(args[1], names)
            ):
                hit(node, "a runtime's name as a default")
            elif args and _names_in(args[-1], names) and len(args) > 1:
                hit(node, "a runtime's name passed as the last argument")
    return found


def test_the_name_branch_finder_flags_every_form() -> None:
    """Positive control: each way the review found of branching on a name is flagged."""
    source = (
        "if inventory.runtime != 'docker': pass\n"
        "what = 'its container' if runtime.name == 'docker' else 'its Ray'\n"
        "ok = runtime in ('docker', 'host')\n"
        "match self.runtime:\n    case 'host': pass\n"
        "RUNTIME_LOG = {'docker': 'container.log'}\n"
        "class C:\n    runtime: str = 'docker'\n"
        "def f(findings, runtime: str = 'docker'): pass\n"
        "x = document.get('runtime', 'docker')\n"
        "plans = plans_for(nodes, facts, 'docker')\n"
        "y = UpResult(runtime='host')\n"
    )
    found = name_branches(source, frozenset({"docker", "host"}))
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 2, 3, 4, 6, 8, 9, 10, 11, 12], found


def test_the_name_branch_finder_leaves_other_uses_alone() -> None:
    source = (
        "exe = need('docker', 'docker.io')\n"
        "text = sections.get('docker', '')\n"
        "state = values.get('docker', 'missing')\n"
        "row = {'host': host, 'port': port}\n"
        "if key == 'host': pass\n"
        "if plan.method == 'host': pass\n"
        "client = docker.from_env()\n"
    )
    assert name_branches(source, frozenset({"docker", "host"})) == []


def test_nothing_outside_the_runtimes_branches_on_a_runtimes_name() -> None:
    from provisioner.runtime.registry import names

    known = frozenset(names())
    assert {"docker", "host"} <= known
    found: list[str] = []
    for path in source_files():
        if any(e in path.parents for e in NAME_BRANCH_EXEMPT):
            continue
        found += name_branches(path.read_text(), known, str(path.relative_to(ROOT)))
    assert not found, "branches on a runtime's name outside provisioner/runtime/:\n  " + (
        "\n  ".join(found)
    )


def _grep(folder: Path) -> str:
    from provisioner.runtime.registry import names

    script = ROOT / "scripts" / "runtime_name_grep.sh"
    env = {"PATH": "/usr/bin:/bin", "RUNTIME_NAMES": "|".join(names())}
    done = subprocess.run(
        ["bash", str(script), folder.name],
        cwd=folder.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_grep_anyone_can_run_finds_no_branch() -> None:
    assert _grep(PACKAGE) == ""


def test_the_grep_finds_a_planted_branch(tmp_path: Path) -> None:
    """Positive control: the grep on a copy of a module with the review's branches back."""
    package = tmp_path / "provisioner"
    (package / "cluster").mkdir(parents=True)
    (package / "runtime").mkdir()
    (package / "cluster" / "status.py").write_text(
        'what = "its container" if runtime.name == "docker" else "its Ray"\n'
        'RUNTIME_LOG = {"docker": "container.log"}\n'
    )
    (package / "runtime" / "docker.py").write_text('if runtime.name == "docker": pass\n')
    found = _grep(package).splitlines()
    assert [line.split(":")[:2] for line in found] == [
        ["provisioner/cluster/status.py", "1"],
        ["provisioner/cluster/status.py", "2"],
    ]


def test_the_inventorys_default_runtime_is_registered() -> None:
    from provisioner.inventory.models import DEFAULT_RUNTIME
    from provisioner.runtime.registry import RUNTIMES

    assert DEFAULT_RUNTIME in RUNTIMES


# --- one context per command ----------------------------------------------------------------
#
# The inventory's runtime is built in one place: `runtime/context.py`'s `cluster_context`
# (the CLI builds one per command and hands it down); the registry only defines it.

RUNTIME_FOR_CALLERS = {"provisioner/runtime/context.py"}


def calls_of(source: str, name: str) -> list[int]:
    """The lines where `source` calls a function called `name` (`f(...)` or `m.f(...)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == name:
                found.append(node.lineno)
    return found


def private_imports(source: str) -> list[str]:
    """`from M import _name`: a private name of another module (dunders aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_the_call_finder_sees_calls_and_private_imports() -> None:
    """Positive control: the readers the checks below rely on."""
    source = (
        "from provisioner.runtime import runtime_for\n"
        "from provisioner.cli.cluster import _pin\n"
        "from provisioner import __version__\n"
        "def f(inv):\n"
        "    a = runtime_for(inv)\n"
        "    return registry.runtime_for(inv, None)\n"
    )
    assert calls_of(source, "runtime_for") == [5, 6]
    assert private_imports(source) == ["2: from provisioner.cli.cluster import _pin"]


def test_the_runtime_is_built_in_one_place() -> None:
    callers = {}
    for path in source_files():
        lines = calls_of(path.read_text(), "runtime_for")
        if lines:
            callers[str(path.relative_to(ROOT))] = lines
    assert set(callers) == RUNTIME_FOR_CALLERS, callers
    assert sum(len(v) for v in callers.values()) == 1, callers


def test_the_doctor_builds_no_runtime_and_looks_up_no_judges_by_name() -> None:
    """The doctor is given the runtime and the pin (the command's context): it calls
    neither `runtime_for`, nor the registry's `judges(name)`, nor reads the pin."""
    found = []
    for path in sorted((PACKAGE / "doctor").rglob("*.py")):
        source = path.read_text()
        for name in ("runtime_for", "judges", "read_pin", "cluster_context"):
            found += [f"{path.relative_to(ROOT)}:{n}: {name}" for n in calls_of(source, name)]
        for node in ast.walk(ast.parse(source)):  # nor under another name
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "provisioner.runtime"
            ):
                names = {a.name for a in node.names} & {"runtime_for", "judges", "context"}
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: imports {n}" for n in names]
    assert not found, found


def test_the_cli_imports_no_private_name_of_another_module() -> None:
    found = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        found += [f"{path.relative_to(ROOT)}:{h}" for h in private_imports(path.read_text())]
    assert not found, "the CLI imports private names:\n  " + "\n  ".join(found)


def test_the_architecture_doc_lists_what_each_package_imports() -> None:
    """docs/architecture.md's layering table says, for each package, what it imports: it
    must be the graph the code has (so the doc stays true)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    graph = package_graph()
    rows = re.findall(r"^\| `([a-z]+)/` \|[^|]*\| ([^|]*) \|$", doc, flags=re.M)
    assert len(rows) >= 10, "the layering table of docs/architecture.md was not found"
    wrong = []
    for package, imports in rows:
        said = {w for w in re.findall(r"[a-z]+", imports) if w in graph and w != package}
        if said != graph[package]:
            wrong.append(
                f"{package}: the doc says {sorted(said)}, the code {sorted(graph[package])}"
            )
    assert not wrong, "\n  ".join(["docs/architecture.md is not the code's layering:", *wrong])


if __name__ == "__main__":
    graph = package_graph()
    for package in sorted(graph):
        print(f"{package} -> {', '.join(sorted(graph[package])) or '(nothing)'}")
    cycles = find_cycles(graph)
    print(describe(graph) if cycles else "no cycles")
    sys.exit(1 if cycles else 0)


# What the CLI may import of where a job runs: the seam (`jobs.place`, `sagemaker.place`)
# and SageMaker's `render` (the files of a real job); nothing of `slurm` (its sbatch script
# is `jobs.place.Sbatch`). The job commands take nothing of `jobs` but the seam.
SEAM_MODULES = {"provisioner.sagemaker": {"place", "render"}, "provisioner.slurm": set()}
JOB_COMMANDS = {"jobs.py", "jobs_group.py", "sagemaker.py"}


def past_the_seam(module: str, job_command: bool) -> bool:
    """True when a CLI module's import of `module` reaches past the seam."""
    allowed = {**SEAM_MODULES, **({"provisioner.jobs": {"place"}} if job_command else {})}
    for package, modules in allowed.items():
        if module == package or module.startswith(package + "."):
            rest = module[len(package) + 1 :].split(".")[0]
            return rest not in modules
    return False


def test_the_seam_finder_sees_an_import_past_the_seam() -> None:
    """Positive control: the rule flags what the CLI imported before the seam."""
    assert past_the_seam("provisioner.sagemaker.local.run_local", job_command=True)
    assert past_the_seam("provisioner.slurm.sbatch.render_sbatch", job_command=False)
    assert past_the_seam("provisioner.jobs.repair.with_retries", job_command=True)
    assert past_the_seam("provisioner.jobs", job_command=True)
    assert not past_the_seam("provisioner.jobs.place.Cluster", job_command=True)
    assert not past_the_seam("provisioner.jobs.control", job_command=False)
    assert not past_the_seam("provisioner.sagemaker.render.render", job_command=True)


def test_the_cli_reaches_where_a_job_runs_through_the_seam() -> None:
    """The CLI runs, follows, resumes a job and brings it home through a `Place`
    (`jobs.place`, `sagemaker.place`), never past it (SageMaker's local mode, the sbatch
    script, the cluster's submit, repair loop or results)."""
    found = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        mods = imported_modules(path)
        job_command = path.name in JOB_COMMANDS
        found += [
            f"{path.relative_to(ROOT)}: {m}"
            for m in sorted(mods)
            if m.startswith("provisioner.") and past_the_seam(m, job_command)
        ]
    assert not found, "the CLI goes past the seam:\n  " + "\n  ".join(found)
    # the finder sees the CLI's (lazy) imports of the places, so it would see the others
    assert "provisioner.sagemaker.place" in imported_modules(PACKAGE / "cli" / "sagemaker.py")
    assert "provisioner.jobs.place" in imported_modules(PACKAGE / "cli" / "cluster.py")
